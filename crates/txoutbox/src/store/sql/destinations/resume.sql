-- Ends the pause of destination $1; no row when it was not paused.
--
-- Parameters:
-- $1 destination: text
UPDATE txoutbox_destinations SET paused_at = NULL, paused_by = NULL,
    paused_reason = NULL, updated_at = now()
WHERE destination = $1 AND paused_at IS NOT NULL RETURNING destination
