//! The conformance suite, once per driver: `<driver>::<behaviour>`.

/// One module per driver, one test per behaviour of `txoutbox_conformance::cases`.
macro_rules! conformance {
    ($($module:ident => $driver:ty),+ $(,)?) => {$(
        mod $module {
            use txoutbox_conformance::cases;

            type D = $driver;

            conformance!(@cases
                a_new_key_runs_the_request_and_writes_its_effects,
                a_retry_with_the_same_key_replays_the_stored_answer,
                the_same_key_for_another_request_is_a_mismatch,
                a_key_held_past_the_lock_timeout_is_in_flight,
                an_unreachable_postgres_is_unavailable_not_new,
                fifty_concurrent_requests_with_one_key_do_the_work_once,
                a_key_past_its_window_runs_again_with_new_downstream_keys,
                deferred_effects_ride_on_the_key_row,
                claim_commit_stores_the_key_and_commits,
                claim_commit_refuses_a_savepoint,
                a_rollback_leaves_nothing,
                business_key_replays_the_first_row_and_refuses_another_request,
                a_new_message_runs_the_handler_and_is_recorded,
                a_redelivered_message_is_a_duplicate,
                fifty_concurrent_deliveries_of_one_message_make_one_effect,
                an_onward_effect_gets_the_key_derived_from_the_message,
            );
        }
    )+};
    (@cases $($case:ident),+ $(,)?) => {$(
        #[tokio::test]
        async fn $case() -> anyhow::Result<()> {
            cases::$case::<D>().await
        }
    )+};
}

conformance! {
    tokio_postgres => txoutbox_conformance::drivers::TokioPostgres,
    deadpool => txoutbox_conformance::drivers::Deadpool,
    sqlx => txoutbox_conformance::drivers::Sqlx,
}
