-- release: removes the level of p_attempt from p_owner's hold with token p_token, and ends
-- the attempt (records it as spent). At 0 levels the lock is handed to the head waiter.
-- Returns 'R <levels left>', also when a release of the attempt removed its level before
-- (this one is re-sent: the levels left of that hold, 0 once it is gone); or 'N' (not held,
-- and not released before: nothing else changed).
CREATE OR REPLACE FUNCTION @schema@.release(
    p_name text, p_owner text, p_token bigint, p_attempt uuid,
    p_horizon_ms bigint, p_margin_ms bigint)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    l @schema@.locks;
    v_orig @schema@.locks;
    v_now timestamptz;
    v_released boolean;
    v_remaining integer;
BEGIN
    -- Created if missing, so this waits for an acquire of the same attempt that is inserting
    -- the row right now, instead of spending the attempt beside a grant about to commit.
    l := @schema@._lock_row(p_name, true, p_margin_ms);
    v_orig := l;
    v_now := clock_timestamp();
    v_released := @schema@._spend(p_name, p_attempt, v_now, p_horizon_ms);
    IF l.name IS NULL THEN
        PERFORM @schema@._gc(p_name, v_now);
        RETURN CASE WHEN v_released THEN 'R 0' ELSE 'N' END;
    END IF;
    l := @schema@._settle(l, v_now);
    IF l.owner IS DISTINCT FROM p_owner OR l.token <> p_token THEN
        -- Released before, by this request's first copy: the hold is gone since, not lost.
        PERFORM @schema@._save(l, v_orig, v_now, p_margin_ms);
        PERFORM @schema@._gc(p_name, v_now);
        RETURN CASE WHEN v_released THEN 'R 0' ELSE 'N' END;
    END IF;
    IF l.pending = p_attempt THEN
        l.pending := NULL;
        l.pending_until := NULL;
    ELSIF p_attempt = ANY (l.levels) THEN
        l.levels := array_remove(l.levels, p_attempt);
    ELSE
        -- No level of it: a re-sent release, or a stranger's.
        PERFORM @schema@._save(l, v_orig, v_now, p_margin_ms);
        PERFORM @schema@._gc(p_name, v_now);
        IF v_released THEN
            RETURN 'R ' || @schema@._count(l);
        END IF;
        RETURN 'N';
    END IF;
    UPDATE @schema@.spent SET released = true WHERE name = p_name AND attempt = p_attempt;
    v_remaining := @schema@._count(l);
    IF v_remaining = 0 THEN
        l := @schema@._settle(l, v_now);
        l := @schema@._hand_over(l, v_now, p_horizon_ms);
    END IF;
    PERFORM @schema@._save(l, v_orig, v_now, p_margin_ms);
    PERFORM @schema@._gc(p_name, v_now);
    RETURN 'R ' || v_remaining;
END $$;
