-- The inbox record of message $2 of consumer $1 (`txoutbox_inbox`).
--
-- Parameters:
-- $1 consumer: text
-- $2 message_id: text
SELECT consumer, message_id, received_at, expires_at, outcome, error,
    expires_at <= now()
FROM txoutbox_inbox WHERE consumer = $1 AND message_id = $2
