-- Gives destinations $1 their flow-control row if they have none (before `destinations/lock.sql`).
--
-- Parameters:
-- $1 destinations: text[]
INSERT INTO txoutbox_destinations (destination)
SELECT unnest($1::text[]) ON CONFLICT (destination) DO NOTHING
