-- list: the locks whose names start with p_prefix that are held or have live waiters.
-- Read-only, one snapshot. Walks the rows of locks with that prefix (an index range scan on
-- the "C"-collated primary key) and counts their live waiters.
CREATE OR REPLACE FUNCTION @schema@.list(p_prefix text)
RETURNS TABLE (name text, owner text, waiters bigint)
-- STABLE: every statement of the function reads the calling statement's snapshot (a
-- VOLATILE function would take a new one per statement, and could pair a holder with a
-- later queue).
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_now timestamptz;
BEGIN
    v_now := clock_timestamp();
    RETURN QUERY
    SELECT s.name, s.owner, s.waiters FROM (
        SELECT l.name,
               (@schema@._settle(l, v_now)).owner AS owner,
               (SELECT count(*) FROM @schema@.waiters w
                WHERE w.name = l.name AND w.deadline > v_now) AS waiters
        FROM @schema@.locks l
        WHERE l.name >= p_prefix AND starts_with(l.name, p_prefix)
    ) s
    WHERE s.owner IS NOT NULL OR s.waiters > 0;
END $$;
