-- fairlock's PostgreSQL state machine: tables and shared helpers. The same transitions as the
-- reference backend (crates/fairlock/src/memory.rs) and the Redis scripts (lua/).
--
-- Installed by the backend on first use, in one transaction under an advisory lock, so several
-- instances starting at once do not race (crates/fairlock-postgres/src/schema.rs). Every
-- statement is idempotent. `@schema@` is replaced by the configured schema (a validated,
-- quoted identifier) and `@channel@` by the wake-up channel (a string literal) before this
-- text is sent.
--
-- Times are the server's: every function takes clock_timestamp() once, after it has locked
-- the lock's row, and the client only ever sends durations (milliseconds).
--
-- Row-locking order, the same in every function, so no two operations deadlock:
--   1. the lock's row in `locks` (SELECT ... FOR UPDATE, created first if missing);
--   2. rows of that lock only, in `waiters`, `spent` and `forced`;
--   3. last, the clean-up (_gc), which locks other rows only with SKIP LOCKED: it never waits
--      (and it deletes another lock's queue entries only after locking that lock's row so).
-- A transaction waits only in steps 1 and 2, and in step 2 only for a holder of the same
-- lock's row (impossible: it holds it) or for a clean-up, which never waits; so no cycle.

CREATE SCHEMA IF NOT EXISTS @schema@;

-- Creates an index unless it exists. Only then: CREATE INDEX IF NOT EXISTS takes its lock on
-- the table before it looks, and an install beside running operations could then deadlock
-- with one that holds a lock row and writes to another table.
CREATE OR REPLACE FUNCTION @schema@._create_index(p_index text, p_statement text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF to_regclass('@schema@.' || quote_ident(p_index)) IS NULL THEN
        EXECUTE p_statement;
    END IF;
END $$;

-- One row per lock that is held, has waiters, or was used within the fence margin.
--   owner .. lease_until   the hold (owner NULL: free). levels = the confirmed levels (one
--                          attempt each); pending/pending_until = the level granted by a
--                          hand-over and not confirmed yet, and when it lapses. Hold count =
--                          cardinality(levels) + (1 if pending). A hold whose lease_until has
--                          passed, or left without levels, is free (functions settle it).
--   last_token             the highest fencing token issued for this lock.
--   next_seq               the next queue position.
--   gc_after               when the row may be deleted: the fence margin after everything it
--                          holds (the lease, every waiter's deadline) has passed.
CREATE TABLE IF NOT EXISTS @schema@.locks (
    name          text COLLATE "C" PRIMARY KEY,
    owner         text,
    token         bigint NOT NULL DEFAULT 0,
    levels        uuid[] NOT NULL DEFAULT '{}',
    pending       uuid,
    pending_until timestamptz,
    lease_until   timestamptz,
    last_token    bigint NOT NULL DEFAULT 0 CHECK (last_token >= 0),
    next_seq      bigint NOT NULL DEFAULT 0,
    gc_after      timestamptz NOT NULL,
    CHECK (owner IS NULL OR (lease_until IS NOT NULL AND token > 0 AND token <= last_token)),
    CHECK ((pending IS NULL) = (pending_until IS NULL))
);
SELECT @schema@._create_index('locks_gc_after', 'CREATE INDEX locks_gc_after ON @schema@.locks (gc_after)');

-- The FIFO queue: one row per queued attempt, served in `seq` order. An entry whose deadline
-- has passed is gone wherever it stands: every read filters it out, and the functions delete
-- such entries a few at a time.
CREATE TABLE IF NOT EXISTS @schema@.waiters (
    name     text COLLATE "C" NOT NULL REFERENCES @schema@.locks (name) ON DELETE CASCADE,
    seq      bigint NOT NULL,
    attempt  uuid NOT NULL,
    owner    text NOT NULL,
    ttl_ms   bigint NOT NULL CHECK (ttl_ms > 0),
    deadline timestamptz NOT NULL,
    PRIMARY KEY (name, seq),
    UNIQUE (name, attempt)
);
SELECT @schema@._create_index('waiters_deadline', 'CREATE INDEX waiters_deadline ON @schema@.waiters (name, deadline)');
-- For the clean-up of expired entries of locks nobody touches any more (_gc).
SELECT @schema@._create_index('waiters_expiry', 'CREATE INDEX waiters_expiry ON @schema@.waiters (deadline)');

-- Spent attempts (granted a level, released or abandoned), remembered until `until` (the
-- resend horizon) so that a late re-send of them changes nothing. `released`: a release
-- removed the attempt's level, so that release sent again answers as it did, not as a lost
-- lease.
CREATE TABLE IF NOT EXISTS @schema@.spent (
    name     text COLLATE "C" NOT NULL,
    attempt  uuid NOT NULL,
    until    timestamptz NOT NULL,
    released boolean NOT NULL DEFAULT false,
    PRIMARY KEY (name, attempt)
);
-- Tables made by an earlier version lack it. Only then altered: ALTER TABLE locks the table
-- against every reader even when the column exists.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = '@schema@.spent'::regclass AND attname = 'released'
                     AND NOT attisdropped) THEN
        ALTER TABLE @schema@.spent ADD COLUMN released boolean NOT NULL DEFAULT false;
    END IF;
END $$;
SELECT @schema@._create_index('spent_until', 'CREATE INDEX spent_until ON @schema@.spent (until)');

-- Holds a force release freed, by token, remembered until `until` (the resend horizon), so
-- that force release sent again answers true as it did.
CREATE TABLE IF NOT EXISTS @schema@.forced (
    name  text COLLATE "C" NOT NULL,
    token bigint NOT NULL,
    until timestamptz NOT NULL,
    PRIMARY KEY (name, token)
);
SELECT @schema@._create_index('forced_until', 'CREATE INDEX forced_until ON @schema@.forced (until)');

-- Which version of these functions is installed (see src/schema.rs).
CREATE TABLE IF NOT EXISTS @schema@.meta (version text NOT NULL);

-- Milliseconds as an interval.
CREATE OR REPLACE FUNCTION @schema@._ms(p_ms bigint) RETURNS interval
LANGUAGE sql IMMUTABLE AS $$ SELECT p_ms * interval '1 millisecond' $$;

-- The lock's row, locked FOR UPDATE (step 1 of the locking order); with p_create, inserted
-- first if missing. Without it, a missing row comes back as all NULLs (name IS NULL).
CREATE OR REPLACE FUNCTION @schema@._lock_row(p_name text, p_create boolean, p_margin_ms bigint)
RETURNS @schema@.locks LANGUAGE plpgsql AS $$
DECLARE
    l @schema@.locks;
BEGIN
    -- Every read after the row lock must see what committed before it: under REPEATABLE READ
    -- it would read the snapshot from before the wait, and could miss a change made meanwhile
    -- (an abandon that spent the attempt). SERIALIZABLE aborts such a pair instead, so every
    -- call that waited for a busy lock's row would fail and be retried, again and again.
    -- (READ UNCOMMITTED runs as READ COMMITTED.)
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'fairlock needs READ COMMITTED, not %',
                        upper(current_setting('transaction_isolation'))
            USING ERRCODE = 'invalid_transaction_state',
                  HINT = 'set default_transaction_isolation for fairlock''s sessions';
    END IF;
    LOOP
        SELECT * INTO l FROM @schema@.locks WHERE name = p_name FOR UPDATE;
        IF FOUND OR NOT p_create THEN
            RETURN l;
        END IF;
        -- Another transaction may insert (or a clean-up delete) the row meanwhile: loop until
        -- the SELECT finds and locks it.
        INSERT INTO @schema@.locks (name, gc_after)
        VALUES (p_name, clock_timestamp() + @schema@._ms(p_margin_ms))
        ON CONFLICT (name) DO NOTHING;
    END LOOP;
END $$;

-- Applies the passage of time to a hold (in memory): a lapsed pending level is gone, and a
-- hold whose lease passed, or that is left without levels, is free.
CREATE OR REPLACE FUNCTION @schema@._settle(l @schema@.locks, v_now timestamptz)
RETURNS @schema@.locks LANGUAGE plpgsql AS $$
BEGIN
    IF l.pending IS NOT NULL AND l.pending_until <= v_now THEN
        l.pending := NULL;
        l.pending_until := NULL;
    END IF;
    IF l.owner IS NOT NULL
       AND (l.lease_until <= v_now OR (cardinality(l.levels) = 0 AND l.pending IS NULL)) THEN
        l.owner := NULL;
        l.token := 0;
        l.levels := '{}';
        l.pending := NULL;
        l.pending_until := NULL;
        l.lease_until := NULL;
    END IF;
    RETURN l;
END $$;

-- The hold count: confirmed levels and the pending one.
CREATE OR REPLACE FUNCTION @schema@._count(l @schema@.locks) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT cardinality(l.levels) + CASE WHEN l.pending IS NULL THEN 0 ELSE 1 END
$$;

-- The next fencing token: one past the last, and never below the server's clock in
-- microseconds, so tokens keep increasing after an idle lock's row is deleted.
CREATE OR REPLACE FUNCTION @schema@._next_token(p_last bigint, v_now timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(p_last + 1, floor(extract(epoch FROM v_now) * 1000000)::bigint)
$$;

-- Records `p_attempt` as spent until the resend horizon from now, keeping a live record's
-- `released`; returns that `released` (false without a live record).
CREATE OR REPLACE FUNCTION @schema@._spend(p_name text, p_attempt uuid, v_now timestamptz,
                                          p_horizon_ms bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_released boolean;
BEGIN
    INSERT INTO @schema@.spent AS s (name, attempt, until)
    VALUES (p_name, p_attempt, v_now + @schema@._ms(p_horizon_ms))
    ON CONFLICT (name, attempt)
    DO UPDATE SET until = excluded.until, released = s.released AND s.until > v_now
    RETURNING released INTO v_released;
    RETURN v_released;
END $$;

-- Whether `p_attempt` is spent (a live record).
CREATE OR REPLACE FUNCTION @schema@._is_spent(p_name text, p_attempt uuid, v_now timestamptz)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM @schema@.spent
                   WHERE name = p_name AND attempt = p_attempt AND until > v_now)
$$;

-- The lock's first live queue entry (`head`, all NULLs if none), found by deleting up to 8
-- expired entries from anywhere in its queue, then the expired ones in front of the head, at
-- most 64 of those: each entry is deleted once, so this is amortised O(log n) in the queue
-- length (index scans only), and no call does more than a bounded part of it. A mass death
-- in front (many processes crashed at once) is cleared over several calls: one call clearing
-- it all could outlast the statement limit, be rolled back, and clear nothing, every time.
-- `unknown`: the budget ran out with expired entries still in front and live ones behind
-- them, so who is first is not known yet (head is all NULLs then). `cleared`: this call
-- deleted an entry that stood in front of the head it returns (the head may not know it is
-- first).
-- (This and _gc find a few rows of a lock by index order. Before the table's statistics
-- know how many rows a lock has, the planner may read all of its rows instead, with a bitmap
-- or sequential scan and a sort: so neither is used.)
CREATE OR REPLACE FUNCTION @schema@._front(p_name text, v_now timestamptz,
                                          OUT head @schema@.waiters, OUT unknown boolean,
                                          OUT cleared boolean)
LANGUAGE plpgsql SET enable_bitmapscan = off SET enable_seqscan = off AS $$
DECLARE
    w @schema@.waiters;
    v_seq bigint;
    -- The last front entry deleted: entries deleted by this transaction stay in the index
    -- until it commits, so each pass starts after them (else k deletions cost O(k^2)).
    v_after bigint := -9223372036854775808;
    v_budget integer := 64;
    -- The lowest queue position the first loop deleted.
    v_lowest bigint;
BEGIN
    unknown := false;
    -- Row by row, by primary key: a single DELETE ... WHERE seq IN (subquery) may be given
    -- a plan that scans the lock's whole queue.
    FOR v_seq IN
        SELECT seq FROM @schema@.waiters
        WHERE name = p_name AND deadline <= v_now
        ORDER BY deadline LIMIT 8
    LOOP
        DELETE FROM @schema@.waiters WHERE name = p_name AND seq = v_seq;
        v_lowest := least(v_lowest, v_seq);
    END LOOP;
    LOOP
        SELECT * INTO w FROM @schema@.waiters WHERE name = p_name AND seq > v_after
        ORDER BY seq LIMIT 1;
        IF NOT FOUND OR w.deadline > v_now THEN
            head := w;
            cleared := v_budget < 64 OR coalesce(v_lowest < w.seq, false);
            RETURN;
        END IF;
        IF v_budget = 0 THEN
            -- Whether anyone live stands behind them (by the deadline index: no walk).
            unknown := EXISTS (SELECT 1 FROM @schema@.waiters
                               WHERE name = p_name AND deadline > v_now);
            cleared := true;
            RETURN;
        END IF;
        DELETE FROM @schema@.waiters WHERE name = p_name AND seq = w.seq;
        v_after := w.seq;
        v_budget := v_budget - 1;
    END LOOP;
END $$;
-- The attempt of the lock's one live queue entry; NULL when it has none or more than one.
-- (By the deadline index only, like _front: no plan may read every live entry.)
CREATE OR REPLACE FUNCTION @schema@._only_live(p_name text, v_now timestamptz) RETURNS uuid
LANGUAGE plpgsql STABLE SET enable_bitmapscan = off SET enable_seqscan = off AS $$
DECLARE
    v_live uuid[];
BEGIN
    v_live := ARRAY(SELECT attempt FROM @schema@.waiters
                    WHERE name = p_name AND deadline > v_now
                    ORDER BY deadline LIMIT 2);
    IF cardinality(v_live) = 1 THEN
        RETURN v_live[1];
    END IF;
    RETURN NULL;
END $$;

-- The version before the budget, which returned the head alone.
DROP FUNCTION IF EXISTS @schema@._head(text, timestamptz);

-- Tells `p_owner`'s waiters of the lock to look again (`R`), or every waiter of it when
-- `p_owner` is NULL (`A`); the notification goes out at commit (see src/wake.rs).
CREATE OR REPLACE FUNCTION @schema@._tell(p_name text, p_owner text)
RETURNS void LANGUAGE sql AS $$
    SELECT pg_notify(@channel@, coalesce('R ' || p_owner, 'A') || E'\n' || p_name)
$$;

-- The lock has just become free (l.owner IS NULL): hand it to the head live waiter as a new
-- hold whose only level is pending, lapsing (with the lease) after the waiter's liveness
-- TTL; spend that attempt and tell its owner (the notification is sent at commit).
CREATE OR REPLACE FUNCTION @schema@._hand_over(l @schema@.locks, v_now timestamptz,
                                              p_horizon_ms bigint)
RETURNS @schema@.locks LANGUAGE plpgsql AS $$
DECLARE
    w @schema@.waiters;
    v_token bigint;
    v_front record;
BEGIN
    v_front := @schema@._front(l.name, v_now);
    w := v_front.head;
    IF w.seq IS NULL THEN
        IF v_front.unknown THEN
            -- Live waiters stand behind more dead ones than this call may clear: the lock
            -- stays free, and every waiter of it looks again; their calls clear the rest and
            -- the first live one takes it (a newcomer cannot: it finds them in front of it).
            PERFORM @schema@._tell(l.name, NULL);
        END IF;
        RETURN l;
    END IF;
    DELETE FROM @schema@.waiters WHERE name = l.name AND seq = w.seq;
    v_token := @schema@._next_token(l.last_token, v_now);
    l.owner := w.owner;
    l.token := v_token;
    l.levels := '{}';
    l.pending := w.attempt;
    l.pending_until := v_now + @schema@._ms(w.ttl_ms);
    l.lease_until := l.pending_until;
    l.last_token := v_token;
    -- Spent until a horizon after the pending level lapses: the waiter may send an acquire
    -- until then.
    PERFORM @schema@._spend(l.name, w.attempt, v_now, w.ttl_ms + p_horizon_ms);
    PERFORM pg_notify(@channel@, 'G ' || v_token || ' ' || replace(w.attempt::text, '-', '')
                                 || ' ' || w.owner || E'\n' || l.name);
    RETURN l;
END $$;

-- Tells the head live waiter's owner to look again (the lock is free and the head changed);
-- every waiter of the lock, when more dead ones stand in front than this call may clear.
CREATE OR REPLACE FUNCTION @schema@._recheck_head(p_name text, v_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_front record;
BEGIN
    v_front := @schema@._front(p_name, v_now);
    IF (v_front.head).seq IS NOT NULL THEN
        PERFORM @schema@._tell(p_name, (v_front.head).owner);
    ELSIF v_front.unknown THEN
        PERFORM @schema@._tell(p_name, NULL);
    END IF;
END $$;

-- Writes the lock's row back if this call changed it. gc_after only moves later: the fence
-- margin after the lease (or after now, for a free lock).
CREATE OR REPLACE FUNCTION @schema@._save(l @schema@.locks, v_orig @schema@.locks,
                                         v_now timestamptz, p_margin_ms bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    l.gc_after := greatest(l.gc_after, coalesce(l.lease_until, v_now) + @schema@._ms(p_margin_ms));
    IF l IS NOT DISTINCT FROM v_orig THEN
        RETURN;
    END IF;
    UPDATE @schema@.locks
    SET owner = l.owner, token = l.token, levels = l.levels, pending = l.pending,
        pending_until = l.pending_until, lease_until = l.lease_until,
        last_token = l.last_token, next_seq = l.next_seq, gc_after = l.gc_after
    WHERE name = l.name;
END $$;

-- Bounded clean-up, the last step of every mutating function (step 3 of the locking order):
-- up to 8 spent-attempt records past their horizon; up to 2 force-release records past
-- theirs; up to 8 expired queue entries of one lock, the one with the oldest dead entry, the
-- caller's own included (so a queue whose waiters died leaves nothing, even if nobody touches
-- that lock again); and up to 2 other locks' rows past gc_after (idle for the fence margin),
-- each after its expired entries, up to 8 of them a call. SKIP LOCKED: it never waits for anyone, so it
-- cannot close a cycle of waits; and it touches a lock's queue only while holding its row.
CREATE OR REPLACE FUNCTION @schema@._gc(p_name text, v_now timestamptz)
RETURNS void LANGUAGE plpgsql SET enable_bitmapscan = off SET enable_seqscan = off AS $$
DECLARE
    v_name text;
    v_attempt uuid;
    v_token bigint;
    v_seq bigint;
BEGIN
    -- Row by row, by primary key, so no plan can turn this into a scan.
    FOR v_name, v_attempt IN
        SELECT name, attempt FROM @schema@.spent WHERE until <= v_now
        ORDER BY until LIMIT 8 FOR UPDATE SKIP LOCKED
    LOOP
        DELETE FROM @schema@.spent WHERE name = v_name AND attempt = v_attempt;
    END LOOP;
    FOR v_name, v_token IN
        SELECT name, token FROM @schema@.forced WHERE until <= v_now
        ORDER BY until LIMIT 2 FOR UPDATE SKIP LOCKED
    LOOP
        DELETE FROM @schema@.forced WHERE name = v_name AND token = v_token;
    END LOOP;
    -- The oldest dead entry of any lock, the caller's own included: passing over the
    -- caller's own (an index on the deadline alone cannot) would walk every dead waiter of
    -- its lock on every call. The caller holds its own lock's row, so locking it again
    -- succeeds; its dead entries are dead to whatever it decided too.
    SELECT name INTO v_name FROM @schema@.waiters
    WHERE deadline <= v_now
    ORDER BY deadline LIMIT 1;
    IF FOUND THEN
        PERFORM 1 FROM @schema@.locks WHERE name = v_name FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            FOR v_seq IN
                SELECT seq FROM @schema@.waiters
                WHERE name = v_name AND deadline <= v_now
                ORDER BY deadline LIMIT 8
            LOOP
                DELETE FROM @schema@.waiters WHERE name = v_name AND seq = v_seq;
            END LOOP;
        END IF;
    END IF;
    FOR v_name IN
        SELECT name FROM @schema@.locks WHERE gc_after <= v_now AND name <> p_name
        ORDER BY gc_after LIMIT 2 FOR UPDATE SKIP LOCKED
    LOOP
        -- Its entries first, 8 a call (all expired: gc_after is past every deadline):
        -- deleting the row would delete them with it, and a mass death leaves too many of
        -- them for one call.
        FOR v_seq IN
            SELECT seq FROM @schema@.waiters WHERE name = v_name ORDER BY seq LIMIT 8
        LOOP
            DELETE FROM @schema@.waiters WHERE name = v_name AND seq = v_seq;
        END LOOP;
        IF NOT EXISTS (SELECT 1 FROM @schema@.waiters WHERE name = v_name) THEN
            DELETE FROM @schema@.locks WHERE name = v_name;
        END IF;
    END LOOP;
END $$;
