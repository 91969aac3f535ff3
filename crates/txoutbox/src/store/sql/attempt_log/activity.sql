-- The last $1 buckets of $2 seconds each (this one included, a bucket starting at a multiple
-- of $2 seconds since the epoch), bucket by bucket: rows delivered, failing relay attempts
-- (`retry`, `failed`, `expired`, `unknown`), and the delivery latency (delivered_at -
-- created_at, seconds) at the 50th and 99th percentiles of the bucket's deliveries.
--
-- Parameters:
-- $1 buckets: int4
-- $2 width_secs: float8
WITH w AS (
    SELECT make_interval(secs => $2) AS width,
        to_timestamp(floor(EXTRACT(EPOCH FROM now())::float8 / $2) * $2) AS last),
buckets AS (
    SELECT generate_series(w.last - w.width * ($1 - 1), w.last, w.width) AS minute FROM w),
d AS (
    SELECT to_timestamp(floor(EXTRACT(EPOCH FROM delivered_at)::float8 / $2) * $2) AS minute,
        count(*) AS n,
        percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM delivered_at - created_at)) AS p50,
        percentile_cont(0.99) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM delivered_at - created_at)) AS p99
    FROM txoutbox_delivered, w
    WHERE delivered_at >= w.last - w.width * ($1 - 1)
    GROUP BY 1),
f AS (
    SELECT to_timestamp(floor(EXTRACT(EPOCH FROM finished_at)::float8 / $2) * $2) AS minute,
        count(*) AS n FROM txoutbox_attempts, w
    WHERE finished_at >= w.last - w.width * ($1 - 1)
      AND outcome IN ('retry', 'failed', 'expired', 'unknown')
    GROUP BY 1)
SELECT buckets.minute, COALESCE(d.n, 0), COALESCE(f.n, 0), d.p50::float8, d.p99::float8
FROM buckets LEFT JOIN d USING (minute) LEFT JOIN f USING (minute) ORDER BY buckets.minute
