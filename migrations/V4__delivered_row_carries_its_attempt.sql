-- Why: the relay's completion was the cost of its hot path, and a third of it was the attempt-log
-- row (and its two index entries) written for every delivery, although the delivered row it moves
-- to txoutbox_delivered in the same statement already holds all but three of its fields. A
-- delivered row now carries its own delivering attempt (relay, lease token, start; its `attempts`
-- is the attempt's number, `delivered_at` its end, `receipt` its receipt), and the log keeps only
-- what no row can carry: retries, failures, lost leases, expiries, at-most-once starts, operator
-- and destination actions.
--
-- `txoutbox_attempts` stays the one place to read every attempt: it becomes a view over the log
-- and the delivered rows' own attempts, with the columns of the table it replaces, and writes to
-- it (INSERT, UPDATE, DELETE) go to whichever of the two holds the row. Rows delivered before this
-- migration keep their attempt in the log (their new columns stay NULL), so nothing is moved.

ALTER TABLE txoutbox_attempts RENAME TO txoutbox_attempt_log;
ALTER INDEX txoutbox_attempts_message RENAME TO txoutbox_attempt_log_message;
ALTER INDEX txoutbox_attempts_finished_at RENAME TO txoutbox_attempt_log_finished_at;

ALTER TABLE txoutbox_delivered
    -- the relay that made the delivering attempt (NULL for rows delivered before V4: their
    -- attempt is in txoutbox_attempt_log)
    ADD COLUMN relay              text,
    -- the lease token the delivering attempt ran under
    ADD COLUMN lease_token        bigint,
    -- when the delivering attempt started (its end is delivered_at)
    ADD COLUMN attempt_started_at timestamptz;

-- Delivered rows are now read by their end time for every recent attempt (`txoutbox stats`, the
-- activity view), so the BRIN index becomes a B-tree: a window of the last minutes reads that
-- window's entries only, not whole block ranges; the purge reads its oldest rows in index order.
-- (The index is rebuilt in this migration's transaction: writes to txoutbox_delivered wait for it,
-- about 0.35 s per million delivered rows on a 2-core machine.)
DROP INDEX txoutbox_delivered_delivered_at;
CREATE INDEX txoutbox_delivered_delivered_at ON txoutbox_delivered (delivered_at);

-- Every attempt and action, as the table of V1-V3 had them. The second branch is a delivered
-- row's own attempt; `WHERE message_id = ...` reads each branch by its primary index.
CREATE VIEW txoutbox_attempts AS
    SELECT message_id, attempt, downstream_key, relay, lease_token, outcome, error, receipt,
           started_at, finished_at, destination
    FROM txoutbox_attempt_log
    UNION ALL
    SELECT id, attempts, downstream_key, relay, lease_token, 'delivered'::text, NULL::text,
           receipt, attempt_started_at, delivered_at, destination
    FROM txoutbox_delivered
    WHERE relay IS NOT NULL;
ALTER VIEW txoutbox_attempts ALTER COLUMN finished_at SET DEFAULT now();

-- Writes through the view: an insert is logged; an update or delete reaches the delivered row
-- when the view row is that row's own attempt, else the one log row equal to it.
CREATE FUNCTION txoutbox_attempts_write() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    target tid;
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO txoutbox_attempt_log (message_id, attempt, downstream_key, relay, lease_token,
            outcome, error, receipt, started_at, finished_at, destination)
        VALUES (NEW.message_id, NEW.attempt, NEW.downstream_key, NEW.relay, NEW.lease_token,
            NEW.outcome, NEW.error, NEW.receipt, NEW.started_at, COALESCE(NEW.finished_at, now()),
            NEW.destination);
        RETURN NEW;
    END IF;
    IF OLD.outcome = 'delivered' AND EXISTS (
        SELECT 1 FROM txoutbox_delivered d
        WHERE d.id = OLD.message_id AND d.relay IS NOT NULL
            AND d.attempt_started_at = OLD.started_at AND d.delivered_at = OLD.finished_at
            AND d.lease_token IS NOT DISTINCT FROM OLD.lease_token) THEN
        IF TG_OP = 'UPDATE' THEN
            UPDATE txoutbox_delivered SET relay = NEW.relay, lease_token = NEW.lease_token,
                attempt_started_at = NEW.started_at, delivered_at = NEW.finished_at,
                receipt = NEW.receipt
            WHERE id = OLD.message_id;
            RETURN NEW;
        END IF;
        UPDATE txoutbox_delivered SET relay = NULL, lease_token = NULL, attempt_started_at = NULL
        WHERE id = OLD.message_id;
        RETURN OLD;
    END IF;
    SELECT l.ctid INTO target FROM txoutbox_attempt_log l
    WHERE l.message_id IS NOT DISTINCT FROM OLD.message_id AND l.attempt = OLD.attempt
        AND l.downstream_key = OLD.downstream_key AND l.relay = OLD.relay
        AND l.lease_token IS NOT DISTINCT FROM OLD.lease_token AND l.outcome = OLD.outcome
        AND l.error IS NOT DISTINCT FROM OLD.error AND l.receipt IS NOT DISTINCT FROM OLD.receipt
        AND l.started_at = OLD.started_at AND l.finished_at = OLD.finished_at
        AND l.destination IS NOT DISTINCT FROM OLD.destination
    LIMIT 1;
    IF target IS NULL THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        UPDATE txoutbox_attempt_log SET message_id = NEW.message_id, attempt = NEW.attempt,
            downstream_key = NEW.downstream_key, relay = NEW.relay, lease_token = NEW.lease_token,
            outcome = NEW.outcome, error = NEW.error, receipt = NEW.receipt,
            started_at = NEW.started_at, finished_at = NEW.finished_at,
            destination = NEW.destination
        WHERE ctid = target;
        RETURN NEW;
    END IF;
    DELETE FROM txoutbox_attempt_log WHERE ctid = target;
    RETURN OLD;
END
$$;
CREATE TRIGGER txoutbox_attempts_write INSTEAD OF INSERT OR UPDATE OR DELETE ON txoutbox_attempts
    FOR EACH ROW EXECUTE FUNCTION txoutbox_attempts_write();
