//! The claim against a database.

use super::{claim_due, ClaimDue};

/// Due rows the current transaction has locked and left pending: the claim's candidates it did
/// not take (a row the transaction locked keeps the transaction's id as its `xmax`).
const LOCKED_NOT_TAKEN: &str = "SELECT count(*) FROM txoutbox_messages \
     WHERE status = 'pending' \
         AND xmax = (pg_current_xact_id()::text::int8 % 4294967296)::text::xid";

#[tokio::test]
async fn a_claim_locks_no_due_row_it_does_not_take_when_none_waits_behind_a_head(
) -> anyhow::Result<()> {
    let db = txoutbox_test_support::test_db().await?;
    let mut client = db.connect().await?;
    client
        .batch_execute(
            "INSERT INTO txoutbox_messages (id, destination, payload, downstream_key) \
             SELECT gen_random_uuid(), 'email', '{}', 'k-' || i \
             FROM generate_series(1, 100) AS i",
        )
        .await?;
    // Both claims: the lean one and the one with the flow-control branches.
    for unbounded in [true, false] {
        let tx = client.transaction().await?;
        let claimed = claim_due(
            &tx,
            &ClaimDue {
                limit: 10,
                owner: "test",
                lease_secs: 30.0,
                held: &[],
                bounded: &[],
                room: &[],
                unbounded,
            },
        )
        .await?;
        assert_eq!(claimed.rows.len(), 10);
        assert_eq!(claimed.parked, 0);
        let locked: i64 = tx.query_one(LOCKED_NOT_TAKEN, &[]).await?.get(0);
        // Every row locked and left is locked again by the next claim: 30 more lock records
        // a claim of 10 when the claim read 4 times its limit.
        assert_eq!(
            locked, 0,
            "the claim (unbounded: {unbounded}) locked {locked} due rows it did not take"
        );
        tx.rollback().await?;
    }
    Ok(())
}
