-- True when $1 was discarded (a replay by id names it: refused with the reason).
--
-- Parameters:
-- $1 id: uuid
SELECT EXISTS (SELECT 1 FROM txoutbox_discarded WHERE id = $1)
