-- extend: sets the lease of p_owner's hold with token p_token to the later of its current end
-- and p_lease_ms from now. Never confirms a pending level. Returns whether that hold exists.
CREATE OR REPLACE FUNCTION @schema@.extend(
    p_name text, p_owner text, p_token bigint, p_lease_ms bigint, p_margin_ms bigint)
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
    v_held := l.owner = p_owner AND l.token = p_token;
    IF v_held THEN
        l.lease_until := greatest(l.lease_until, v_now + @schema@._ms(p_lease_ms));
    END IF;
    PERFORM @schema@._save(l, v_orig, v_now, p_margin_ms);
    RETURN coalesce(v_held, false);
END $$;
