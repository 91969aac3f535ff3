-- Whether destination $1 is named by a row of the hot table, the delivered history, the
-- discarded rows or flow control. Each probe is one index entry (`txoutbox_messages_dedup`,
-- `txoutbox_delivered_key`, the primary key of `txoutbox_destinations`); discarded rows are
-- few (they leave only by an operator's hand).
--
-- Parameters:
-- $1 destination: text
SELECT EXISTS (SELECT 1 FROM txoutbox_messages WHERE destination = $1)
OR EXISTS (SELECT 1 FROM txoutbox_delivered WHERE destination = $1)
OR EXISTS (SELECT 1 FROM txoutbox_discarded WHERE destination = $1)
OR EXISTS (SELECT 1 FROM txoutbox_destinations WHERE destination = $1)
