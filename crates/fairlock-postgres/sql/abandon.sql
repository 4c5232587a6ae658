-- abandon: ends p_attempt whatever it has: its queue entry, its pending or confirmed level
-- (handing the lock on if that was the last level). Records it as spent, also when it had
-- nothing.
CREATE OR REPLACE FUNCTION @schema@.abandon(
    p_name text, p_owner text, p_attempt uuid, p_horizon_ms bigint, p_margin_ms bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    l @schema@.locks;
    v_orig @schema@.locks;
    v_now timestamptz;
    v_front record;
    v_was_head boolean;
    v_freed boolean := false;
BEGIN
    -- Created if missing, so this waits for an acquire of the same attempt that is inserting
    -- the row right now, instead of spending the attempt beside a grant about to commit.
    l := @schema@._lock_row(p_name, true, p_margin_ms);
    v_orig := l;
    v_now := clock_timestamp();
    PERFORM @schema@._spend(p_name, p_attempt, v_now, p_horizon_ms);
    IF l.name IS NULL THEN
        PERFORM @schema@._gc(p_name, v_now);
        RETURN;
    END IF;
    l := @schema@._settle(l, v_now);
    v_front := @schema@._front(p_name, v_now);
    -- Behind more dead entries than the call may clear, it may have been the first live one.
    v_was_head := (v_front.head).attempt = p_attempt OR v_front.unknown;
    DELETE FROM @schema@.waiters WHERE name = p_name AND attempt = p_attempt;
    IF l.owner = p_owner THEN
        IF l.pending = p_attempt THEN
            l.pending := NULL;
            l.pending_until := NULL;
        ELSE
            l.levels := array_remove(l.levels, p_attempt);
        END IF;
        IF @schema@._count(l) = 0 THEN
            l := @schema@._settle(l, v_now);
            v_freed := true;
        END IF;
    END IF;
    IF v_freed THEN
        l := @schema@._hand_over(l, v_now, p_horizon_ms);
    ELSIF v_was_head AND l.owner IS NULL THEN
        -- The lock is free: the new head may take it now rather than at its heartbeat.
        PERFORM @schema@._recheck_head(p_name, v_now);
    END IF;
    PERFORM @schema@._save(l, v_orig, v_now, p_margin_ms);
    PERFORM @schema@._gc(p_name, v_now);
END $$;
