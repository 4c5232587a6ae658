-- force_release: frees the hold with token p_token, whoever holds it and whatever its count,
-- and hands the lock to the head waiter. Returns whether that hold existed.
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
        RETURN false;
    END IF;
    v_orig := l;
    v_now := clock_timestamp();
    l := @schema@._settle(l, v_now);
    v_held := l.owner IS NOT NULL AND l.token = p_token;
    IF v_held THEN
        l.owner := NULL;
        l := @schema@._settle(l, v_now);
        l := @schema@._hand_over(l, v_now, p_horizon_ms);
    END IF;
    PERFORM @schema@._save(l, v_orig, v_now, p_margin_ms);
    PERFORM @schema@._gc(p_name, v_now);
    RETURN v_held;
END $$;
