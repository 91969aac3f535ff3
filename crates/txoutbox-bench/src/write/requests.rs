//! One request of each [`Mode`]: the library's paths and the hand-written SQL they are
//! measured against, with the statements the hand-written ones send.

use anyhow::Result;
use deadpool_postgres::Transaction;
use txoutbox::{
    relay::RelayWaker, Begin, Fingerprint, IdempotencyKey, OutboxMessage, Scope, StoredResponse,
};

use super::Mode;

pub(super) const INSERT_ORDER: &str =
    "INSERT INTO bench_orders (customer, amount) VALUES ($1, $2) RETURNING id";

/// The hand-written baseline's statements (see [`Mode::HandWritten`]).
const HAND_CLAIM_KEY: &str = "INSERT INTO txoutbox_idempotency_keys \
     (scope, key, fingerprint, state, expires_at) \
     VALUES ($1, $2, $3, 'in_flight', now() + interval '24 hours') ON CONFLICT DO NOTHING";
const HAND_OUTBOX: &str = "INSERT INTO txoutbox_messages \
     (id, destination, payload, downstream_key) VALUES ($1, 'stripe', $2, $3), ($4, 'email', $5, $6)";
const HAND_COMPLETE_KEY: &str = "UPDATE txoutbox_idempotency_keys SET state = 'completed', \
     response_status = $3, response_headers = $4, response_body = $5 \
     WHERE scope = $1 AND key = $2";

/// [`Mode::HandWrittenOneRow`]'s statements.
const HAND_LOCK: &str = "SELECT pg_advisory_xact_lock(hashtextextended($1 || chr(10) || $2, 4411))";
const HAND_LOOKUP: &str = "SELECT fingerprint, response_status, response_headers, response_body \
     FROM txoutbox_idempotency_keys WHERE scope = $1 AND key = $2";
const HAND_STORE_ONE_ROW: &str = "INSERT INTO txoutbox_idempotency_keys \
     (scope, key, fingerprint, state, response_status, response_headers, response_body, \
     expires_at, effects) \
     VALUES ($1, $2, $3, 'completed', $4, $5, $6, now() + interval '24 hours', $7)";

const KEYED_LOOKUP: &str = "SELECT id FROM bench_keyed_orders WHERE idempotency_key = $1";
const KEYED_INSERT: &str = "INSERT INTO bench_keyed_orders \
     (customer, amount, idempotency_key, request_fingerprint) VALUES ($1, $2, $3, $4) \
     ON CONFLICT (idempotency_key) DO NOTHING RETURNING id";

/// What the paths measured against the library's take: one order request with its key.
#[derive(Clone, Copy)]
struct KeyedOrder<'a> {
    scope: &'a Scope,
    key: &'a IdempotencyKey,
    fingerprint: &'a Fingerprint,
    customer: &'a str,
    amount: i64,
}

/// One request of `mode`, for one order (customer, amount).
pub(super) async fn one_request(
    client: &mut deadpool_postgres::Object,
    scope: &Scope,
    waker: &RelayWaker,
    mode: Mode,
    (customer, amount): (String, i64),
) -> Result<()> {
    if matches!(mode, Mode::HandWrittenOneRow | Mode::HandWrittenTwoTrips) {
        let two_trips = mode == Mode::HandWrittenTwoTrips;
        return hand_written_one_row(client, scope, &customer, amount, two_trips).await;
    }
    let tx = client.transaction().await?;
    if mode == Mode::Business {
        let insert = tx.prepare_cached(INSERT_ORDER).await?;
        tx.query(&insert, &[&customer, &amount]).await?;
        tx.commit().await?;
        return Ok(());
    }
    let key = fresh_key()?;
    let fingerprint = order_fingerprint(&customer, amount);
    let keyed = KeyedOrder {
        scope,
        key: &key,
        fingerprint: &fingerprint,
        customer: &customer,
        amount,
    };
    if mode == Mode::HandWritten {
        return hand_written(tx, &keyed).await;
    }
    if mode == Mode::BusinessKey {
        return business_key(tx, &keyed).await;
    }
    let insert = tx.prepare_cached(INSERT_ORDER).await?;
    let values: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&customer, &amount];
    let pipelined = matches!(
        mode,
        Mode::FullPipelined | Mode::FullCommit | Mode::FullOneRow
    );
    let (outcome, row) = if pipelined {
        let (outcome, row) = futures::join!(
            txoutbox::begin(&tx, scope, &key, &fingerprint),
            tx.query(&insert, &values)
        );
        (outcome?, row)
    } else {
        let outcome = txoutbox::begin(&tx, scope, &key, &fingerprint).await?;
        (outcome, tx.query(&insert, &values).await)
    };
    let Begin::New(mut claim) = outcome else {
        anyhow::bail!("a fresh key was not new");
    };
    let row = row?;
    let id: i64 = row.first().map(|r| r.get(0)).unwrap_or_default();
    for (effect, message) in effects(id, amount, &customer)? {
        claim.enqueue(effect, message)?;
    }
    if mode == Mode::FullNotifyInTx {
        txoutbox::relay::notify_in_transaction(&tx).await?;
    }
    let response = order_response(id);
    if matches!(
        mode,
        Mode::FullCommit | Mode::FullOneRow | Mode::FullOneRowAfterBegin
    ) {
        claim.commit(tx, &response).await?;
        return Ok(());
    }
    claim.complete(&tx, &response).await?;
    tx.commit().await?;
    if mode == Mode::FullHintAfterCommit {
        waker.wake();
    }
    Ok(())
}

/// The customer and the amount of client `client_no`'s `n`th order.
pub(super) fn order(client_no: usize, n: u64) -> (String, i64) {
    (format!("customer-{client_no}"), (n % 10_000) as i64)
}

/// A fresh idempotency key (a UUIDv7), as a client sends with each new request.
pub(super) fn fresh_key() -> Result<IdempotencyKey> {
    Ok(IdempotencyKey::parse(&uuid::Uuid::now_v7().to_string())?)
}

/// The fingerprint of an order request (`POST /orders` with the order's JSON body).
pub(super) fn order_fingerprint(customer: &str, amount: i64) -> Fingerprint {
    let body = format!(r#"{{"customer":"{customer}","amount":{amount}}}"#);
    Fingerprint::new("POST", "/orders", body.as_bytes())
}

/// The response an order request stores: 201 with the order's id.
pub(super) fn order_response(id: i64) -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: format!(r#"{{"order":{id}}}"#).into_bytes(),
    }
}

/// The two effects of an order request, by effect name: its charge and its receipt.
pub(super) fn effects(
    id: i64,
    amount: i64,
    customer: &str,
) -> Result<[(&'static str, OutboxMessage); 2]> {
    Ok([
        (
            "charge",
            OutboxMessage::new(
                "stripe",
                &serde_json::json!({"order": id, "amount": amount}),
            )?,
        ),
        (
            "receipt",
            OutboxMessage::new("email", &serde_json::json!({"order": id, "to": customer}))?,
        ),
    ])
}

/// One request with the business row as its key record ([`Mode::BusinessKey`]).
async fn business_key(tx: Transaction<'_>, req: &KeyedOrder<'_>) -> Result<()> {
    use tokio_postgres::types::Type;
    use txoutbox::idempotency::{BusinessKey, RowBegin};
    let orders = BusinessKey::new(req.scope.clone(), KEYED_LOOKUP, "request_fingerprint");
    let fp: &[u8] = req.fingerprint.as_bytes();
    let begun = orders
        .begin(
            &*tx,
            req.key,
            req.fingerprint,
            KEYED_INSERT,
            &[
                (&req.customer, Type::TEXT),
                (&req.amount, Type::INT8),
                (&req.key.as_str(), Type::TEXT),
                (&fp, Type::BYTEA),
            ],
        )
        .await?;
    let RowBegin::New { row, mut claim } = begun else {
        anyhow::bail!("a fresh key was not new");
    };
    let id: i64 = row.get(0);
    for (effect, message) in effects(id, req.amount, req.customer)? {
        claim.enqueue(effect, message)?;
    }
    claim.complete(&*tx).await?;
    tx.commit().await?;
    Ok(())
}

/// One request as a team would write it by hand storing the same information in one row
/// ([`Mode::HandWrittenOneRow`]): three round trips, the transaction begun and committed by hand
/// so that the COMMIT rides with the key row's insert; with `two_trips`, the BEGIN rides with the
/// first statements too ([`Mode::HandWrittenTwoTrips`]).
async fn hand_written_one_row(
    client: &mut deadpool_postgres::Object,
    scope: &Scope,
    customer: &str,
    amount: i64,
    two_trips: bool,
) -> Result<()> {
    let key = uuid::Uuid::now_v7().to_string();
    let fingerprint = order_fingerprint(customer, amount);
    let scope = scope.name();
    let (lock, lookup, insert, store) = (
        client.prepare_cached(HAND_LOCK).await?,
        client.prepare_cached(HAND_LOOKUP).await?,
        client.prepare_cached(INSERT_ORDER).await?,
        client.prepare_cached(HAND_STORE_ONE_ROW).await?,
    );
    type Values<'a> = Vec<&'a (dyn tokio_postgres::types::ToSql + Sync)>;
    let key_values: Values = vec![&scope, &key];
    let order_values: Values = vec![&customer, &amount];
    if !two_trips {
        client.batch_execute("BEGIN").await?;
    }
    // With two trips the BEGIN is the first request of the pipeline (polled first by join!).
    let pipelined_begin = async {
        if two_trips {
            client.batch_execute("BEGIN").await
        } else {
            Ok(())
        }
    };
    let (begun, locked, found, order) = futures::join!(
        pipelined_begin,
        client.query(&lock, &key_values),
        client.query(&lookup, &key_values),
        client.query(&insert, &order_values)
    );
    begun?;
    locked?;
    anyhow::ensure!(found?.is_empty(), "a fresh key was not new");
    let id: i64 = order?.first().map(|r| r.get(0)).unwrap_or_default();
    let effects = serde_json::json!([
        {"id": uuid::Uuid::now_v7(), "destination": "stripe",
         "payload": {"order": id, "amount": amount}, "downstream_key": format!("{scope}:{key}:charge")},
        {"id": uuid::Uuid::now_v7(), "destination": "email",
         "payload": {"order": id, "to": customer}, "downstream_key": format!("{scope}:{key}:receipt")},
    ]);
    let (fp, headers, response) = (
        fingerprint.as_bytes().as_slice(),
        serde_json::json!([["content-type", "application/json"]]),
        format!(r#"{{"order":{id}}}"#).into_bytes(),
    );
    let store_values: Values = vec![&scope, &key, &fp, &201i16, &headers, &response, &effects];
    let (stored, committed) = futures::join!(
        client.execute(&store, &store_values),
        client.batch_execute("COMMIT")
    );
    stored?;
    committed?;
    Ok(())
}

/// One request as a team would write it without a framework, storing what the framework stores:
/// the key row (scope, key, fingerprint, state, then the response), the business row and the 2
/// outbox rows, each effect's downstream key derived from the request's key.
async fn hand_written(tx: Transaction<'_>, req: &KeyedOrder<'_>) -> Result<()> {
    let (scope, key) = (req.scope.name(), req.key.as_str());
    let claim = tx.prepare_cached(HAND_CLAIM_KEY).await?;
    let claimed = tx
        .execute(
            &claim,
            &[&scope, &key, &req.fingerprint.as_bytes().as_slice()],
        )
        .await?;
    anyhow::ensure!(claimed == 1, "a fresh key was not new");
    let insert = tx.prepare_cached(INSERT_ORDER).await?;
    let id: i64 = tx
        .query_one(&insert, &[&req.customer, &req.amount])
        .await?
        .get(0);
    let outbox = tx.prepare_cached(HAND_OUTBOX).await?;
    let (charge, receipt) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    tx.execute(
        &outbox,
        &[
            &charge,
            &serde_json::json!({"order": id, "amount": req.amount}),
            &format!("{scope}:{key}:charge"),
            &receipt,
            &serde_json::json!({"order": id, "to": req.customer}),
            &format!("{scope}:{key}:receipt"),
        ],
    )
    .await?;
    let complete = tx.prepare_cached(HAND_COMPLETE_KEY).await?;
    tx.execute(
        &complete,
        &[
            &scope,
            &key,
            &201i16,
            &serde_json::json!([["content-type", "application/json"]]),
            &format!(r#"{{"order":{id}}}"#).into_bytes(),
        ],
    )
    .await?;
    tx.commit().await?;
    Ok(())
}
