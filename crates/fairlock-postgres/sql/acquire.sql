-- acquire: grant, re-enter, confirm a pending grant, or join/stay in the queue.
-- One call is one statement, so one transaction. Returns text:
--   'G <token> <hold count>'  the attempt holds a level: a first grant, a re-entry, a
--                             confirmed hand-over, or a level it already had (a re-send)
--   'Q <ms> <last token>'     queued; <ms> = when the hold ends, if the caller is the head
--                             waiter (worth a look then), 0 if the lock is free but more
--                             dead entries stand in front than one call clears (call again
--                             at once), -1 otherwise; <last token> = the highest token
--                             issued for this lock (0 if none)
--   'B'                       busy, and the request did not ask to queue; or the attempt is
--                             spent (a late re-send), which changes nothing
CREATE OR REPLACE FUNCTION @schema@.acquire(
    p_name text, p_owner text, p_attempt uuid, p_lease_ms bigint, p_ttl_ms bigint,
    p_queue boolean, p_horizon_ms bigint, p_margin_ms bigint)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    l @schema@.locks;
    v_orig @schema@.locks;
    v_now timestamptz;
    v_spent boolean;
    v_front record;
    v_head @schema@.waiters;
    v_unknown boolean;
    v_mine @schema@.waiters;
    v_token bigint;
    v_deadline timestamptz;
    v_ends timestamptz;
BEGIN
    l := @schema@._lock_row(p_name, true, p_margin_ms);
    v_orig := l;
    v_now := clock_timestamp();
    l := @schema@._settle(l, v_now);
    v_spent := @schema@._is_spent(p_name, p_attempt, v_now);

    IF l.owner IS NOT NULL THEN
        IF p_attempt = ANY (l.levels) THEN
            -- Applied before (a re-sent request, or a reply that was lost): the same grant.
            PERFORM @schema@._save(l, v_orig, v_now, p_margin_ms);
            RETURN 'G ' || l.token || ' ' || @schema@._count(l);
        END IF;
        IF l.pending = p_attempt THEN
            -- The grantee confirms its hand-over: the pending level becomes a confirmed one,
            -- and the lease is lengthened, never shortened.
            l.levels := l.levels || p_attempt;
            l.pending := NULL;
            l.pending_until := NULL;
            l.lease_until := greatest(l.lease_until, v_now + @schema@._ms(p_lease_ms));
            PERFORM @schema@._save(l, v_orig, v_now, p_margin_ms);
            PERFORM @schema@._gc(p_name, v_now);
            RETURN 'G ' || l.token || ' ' || @schema@._count(l);
        END IF;
    END IF;

    IF v_spent THEN
        -- Granted before or ended: a request of it that comes late changes nothing.
        PERFORM @schema@._save(l, v_orig, v_now, p_margin_ms);
        RETURN 'B';
    END IF;

    IF l.owner = p_owner THEN
        -- Re-entry: one more level, for this attempt, without queueing.
        l.levels := l.levels || p_attempt;
        l.lease_until := greatest(l.lease_until, v_now + @schema@._ms(p_lease_ms));
        DELETE FROM @schema@.waiters WHERE name = p_name AND attempt = p_attempt;
        PERFORM @schema@._spend(p_name, p_attempt, v_now, p_horizon_ms);
        PERFORM @schema@._save(l, v_orig, v_now, p_margin_ms);
        PERFORM @schema@._gc(p_name, v_now);
        RETURN 'G ' || l.token || ' ' || @schema@._count(l);
    END IF;

    v_front := @schema@._front(p_name, v_now);
    v_head := v_front.head;
    v_unknown := v_front.unknown;
    IF v_unknown AND @schema@._only_live(p_name, v_now) = p_attempt THEN
        -- More dead entries in front than this call may clear, but the one live entry is the
        -- caller's: it is first all the same.
        SELECT * INTO v_head FROM @schema@.waiters WHERE name = p_name AND attempt = p_attempt;
        v_unknown := false;
    END IF;
    IF l.owner IS NULL AND NOT v_unknown AND (v_head.seq IS NULL OR v_head.attempt = p_attempt) THEN
        -- Free, and nobody live ahead: a first grant, with a new token.
        IF v_head.seq IS NOT NULL THEN
            DELETE FROM @schema@.waiters WHERE name = p_name AND seq = v_head.seq;
        END IF;
        v_token := @schema@._next_token(l.last_token, v_now);
        l.owner := p_owner;
        l.token := v_token;
        l.levels := ARRAY[p_attempt];
        l.pending := NULL;
        l.pending_until := NULL;
        l.lease_until := v_now + @schema@._ms(p_lease_ms);
        l.last_token := v_token;
        PERFORM @schema@._spend(p_name, p_attempt, v_now, p_horizon_ms);
        PERFORM @schema@._save(l, v_orig, v_now, p_margin_ms);
        PERFORM @schema@._gc(p_name, v_now);
        RETURN 'G ' || v_token || ' 1';
    END IF;

    IF l.owner IS NULL AND v_head.seq IS NOT NULL AND v_head.attempt <> p_attempt
       AND v_front.cleared THEN
        -- The lock is free and this call cleared the dead in front of the head: tell it now
        -- rather than at its next heartbeat.
        PERFORM @schema@._tell(p_name, v_head.owner);
    END IF;

    IF NOT p_queue THEN
        PERFORM @schema@._save(l, v_orig, v_now, p_margin_ms);
        RETURN 'B';
    END IF;

    -- Join, or refresh the deadline and keep the place; an entry already expired has lost it
    -- and joins again at the tail.
    v_deadline := v_now + @schema@._ms(p_ttl_ms);
    SELECT * INTO v_mine FROM @schema@.waiters WHERE name = p_name AND attempt = p_attempt;
    IF FOUND AND v_mine.deadline <= v_now THEN
        DELETE FROM @schema@.waiters WHERE name = p_name AND seq = v_mine.seq;
        v_mine := NULL;
    END IF;
    IF v_mine.seq IS NOT NULL THEN
        UPDATE @schema@.waiters SET deadline = v_deadline, ttl_ms = p_ttl_ms, owner = p_owner
        WHERE name = p_name AND seq = v_mine.seq;
    ELSE
        INSERT INTO @schema@.waiters (name, seq, attempt, owner, ttl_ms, deadline)
        VALUES (p_name, l.next_seq, p_attempt, p_owner, p_ttl_ms, v_deadline);
        IF v_head.seq IS NULL AND NOT v_unknown THEN
            v_head.seq := l.next_seq;
            v_head.attempt := p_attempt;
        END IF;
        l.next_seq := l.next_seq + 1;
    END IF;
    l.gc_after := greatest(l.gc_after, v_deadline + @schema@._ms(p_margin_ms));
    PERFORM @schema@._save(l, v_orig, v_now, p_margin_ms);
    PERFORM @schema@._gc(p_name, v_now);

    IF v_unknown AND l.owner IS NULL THEN
        -- Free, but the dead in front are not all cleared: ask again at once to clear more.
        RETURN 'Q 0 ' || l.last_token;
    END IF;
    IF l.owner IS NOT NULL AND (v_head.attempt = p_attempt OR v_unknown) THEN
        -- The head waiter (or, behind dead entries not cleared yet, any waiter: it may be the
        -- head) may look again when the hold ends: its lease, or sooner when its only level
        -- is a pending one.
        v_ends := l.lease_until;
        IF cardinality(l.levels) = 0 AND l.pending_until IS NOT NULL THEN
            v_ends := least(v_ends, l.pending_until);
        END IF;
        RETURN 'Q ' || greatest(0, ceil(extract(epoch FROM (v_ends - v_now)) * 1000))::bigint
               || ' ' || l.last_token;
    END IF;
    RETURN 'Q -1 ' || l.last_token;
END $$;
