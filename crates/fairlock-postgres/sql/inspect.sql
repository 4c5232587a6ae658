-- The holder row of inspect and holder: none if the lock is free (or unknown).
CREATE OR REPLACE FUNCTION @schema@._holder(p_name text, v_now timestamptz)
RETURNS TABLE (kind text, owner text, attempt uuid, token bigint, hold_count integer,
               left_us bigint, confirmed boolean)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    l @schema@.locks;
BEGIN
    SELECT * INTO l FROM @schema@.locks WHERE name = p_name;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    l := @schema@._settle(l, v_now);
    IF l.owner IS NOT NULL THEN
        RETURN QUERY SELECT 'h'::text, l.owner, NULL::uuid, l.token, @schema@._count(l),
            greatest(0, floor(extract(epoch FROM (l.lease_until - v_now)) * 1000000))::bigint,
            l.pending IS NULL;
    END IF;
END $$;

-- inspect: a snapshot of one lock, read-only (one statement, one snapshot; it locks nothing).
-- The holder first (kind 'h', if held), then the live waiters in queue order (kind 'w').
-- Times left are in microseconds, by the server's clock. The only function that walks the
-- queue.
CREATE OR REPLACE FUNCTION @schema@.inspect(p_name text)
RETURNS TABLE (kind text, owner text, attempt uuid, token bigint, hold_count integer,
               left_us bigint, confirmed boolean)
-- STABLE: every statement of the function reads the calling statement's snapshot (a
-- VOLATILE function would take a new one per statement, and could pair a holder with a
-- later queue).
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_now timestamptz;
BEGIN
    v_now := clock_timestamp();
    RETURN QUERY SELECT * FROM @schema@._holder(p_name, v_now);
    RETURN QUERY SELECT 'w'::text, w.owner, w.attempt, NULL::bigint, NULL::integer,
            floor(extract(epoch FROM (w.deadline - v_now)) * 1000000)::bigint, NULL::boolean
        FROM @schema@.waiters w
        WHERE w.name = p_name AND w.deadline > v_now
        ORDER BY w.seq;
END $$;

-- holder: inspect's holder row alone, without reading the queue (`LockGuard::is_held` and
-- `force_unlock` ask only this, the CLI's holder check every second).
CREATE OR REPLACE FUNCTION @schema@.holder(p_name text)
RETURNS TABLE (kind text, owner text, attempt uuid, token bigint, hold_count integer,
               left_us bigint, confirmed boolean)
LANGUAGE sql STABLE AS $$
    SELECT * FROM @schema@._holder(p_name, clock_timestamp())
$$;
