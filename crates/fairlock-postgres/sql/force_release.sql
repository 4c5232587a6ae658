-- force_release: frees the hold with token p_token, whoever holds it and whatever its count,
-- and hands the lock to the head waiter. Returns whether that hold existed, or a force release
-- of it freed it before (this one is re-sent: answered as the first was).
CREATE OR REPLACE FUNCTION @schema@.force_release(
    p_name text, p_token bigint, p_horizon_ms bigint, p_margin_ms bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    l @schema@.locks;
    v_orig @schema@.locks;
    v_now timestamptz;
    v_held boolean;
BEGIN
    l := @schema@._lock_row(p_name, false, p_margin_ms);
    IF l.name IS NULL THEN
        RETURN EXISTS (SELECT 1 FROM @schema@.forced
                       WHERE name = p_name AND token = p_token AND until > clock_timestamp());
    END IF;
    v_orig := l;
    v_now := clock_timestamp();
    l := @schema@._settle(l, v_now);
    v_held := l.owner IS NOT NULL AND l.token = p_token;
    IF v_held THEN
        l.owner := NULL;
        l := @schema@._settle(l, v_now);
        l := @schema@._hand_over(l, v_now, p_horizon_ms);
        INSERT INTO @schema@.forced (name, token, until)
        VALUES (p_name, p_token, v_now + @schema@._ms(p_horizon_ms))
        ON CONFLICT (name, token) DO UPDATE SET until = excluded.until;
    ELSE
        v_held := EXISTS (SELECT 1 FROM @schema@.forced
                          WHERE name = p_name AND token = p_token AND until > v_now);
    END IF;
    PERFORM @schema@._save(l, v_orig, v_now, p_margin_ms);
    PERFORM @schema@._gc(p_name, v_now);
    RETURN v_held;
END $$;
