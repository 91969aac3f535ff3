-- The purge's cutoff, fixed once so that every batch and the dry run agree.
--
-- Parameters:
-- $1 secs: float8
SELECT now() - make_interval(secs => $1)
