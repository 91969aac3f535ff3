-- The channel the write path's hint arrives on.
--
-- Parameters: none.
LISTEN txoutbox_wake
