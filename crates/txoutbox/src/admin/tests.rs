//! Unit tests of the rules that need no database (the commands themselves are tested end to end
//! in `txoutbox-tests`, `txoutbox-cli` and `txoutbox-dashboard`).

use uuid::Uuid;

use super::discard::discard_note;
use super::known::closest_first;
use super::replay::replayed_statuses;
use super::{replay_downstream_key, MessageFilter, ReplayOptions};
use crate::state::MessageStatus;

#[test]
fn replay_keys_are_deterministic_and_new_at_each_replay() {
    let id = Uuid::now_v7();
    let first = replay_downstream_key(id, "k-1");
    assert_eq!(first, replay_downstream_key(id, "k-1"));
    assert_ne!(first, "k-1");
    assert_ne!(replay_downstream_key(id, &first), first);
    assert_ne!(replay_downstream_key(Uuid::now_v7(), "k-1"), first);
}

#[test]
fn a_discard_note_names_the_operator_after_the_reason() {
    assert_eq!(
        discard_note("refunded by hand", Some("alice")),
        "refunded by hand (by operator alice)"
    );
    assert_eq!(discard_note("refunded by hand", None), "refunded by hand");
}

#[test]
fn statuses_parse_from_their_column_values() {
    for status in MessageStatus::ALL {
        assert_eq!(status.as_str().parse::<MessageStatus>().ok(), Some(status));
    }
    assert_eq!(
        "in-flight".parse::<MessageStatus>().ok(),
        Some(MessageStatus::InFlight)
    );
    assert!("dead".parse::<MessageStatus>().is_err());
}

#[test]
fn replay_by_filter_takes_failed_rows_unless_unknown_is_asked_for() {
    let opts = ReplayOptions::default();
    let filter = |status| MessageFilter {
        status,
        ..MessageFilter::default()
    };
    assert_eq!(
        replayed_statuses(&filter(None), &opts).ok(),
        Some(vec![MessageStatus::Failed])
    );
    assert_eq!(
        replayed_statuses(&filter(Some(MessageStatus::Unknown)), &opts).ok(),
        Some(vec![MessageStatus::Unknown])
    );
    assert!(replayed_statuses(&filter(Some(MessageStatus::Delivered)), &opts).is_err());
    assert!(replayed_statuses(&filter(Some(MessageStatus::Pending)), &opts).is_err());
    let with_delivered = ReplayOptions {
        include_delivered: true,
        ..ReplayOptions::default()
    };
    assert_eq!(
        replayed_statuses(&filter(None), &with_delivered).ok(),
        Some(vec![MessageStatus::Failed, MessageStatus::Delivered])
    );
    assert_eq!(
        replayed_statuses(&filter(Some(MessageStatus::Delivered)), &with_delivered).ok(),
        Some(vec![MessageStatus::Delivered])
    );
}

#[test]
fn attempt_outcomes_parse_from_their_column_values() {
    for outcome in crate::state::AttemptOutcome::ALL {
        assert_eq!(
            outcome
                .as_str()
                .parse::<crate::state::AttemptOutcome>()
                .ok(),
            Some(outcome)
        );
    }
    assert!("unstarted".parse::<crate::state::AttemptOutcome>().is_err());
}

#[test]
fn an_unknown_destination_is_answered_with_the_closest_names_first() {
    let names = |list: &[&str]| list.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        closest_first(
            "emial",
            names(&["stripe", "webhook:orders", "email", "stripe"])
        ),
        names(&["email", "stripe", "webhook:orders"])
    );
    assert_eq!(
        closest_first(
            "webhook:*",
            names(&["email", "webhook:orders", "webhook:billing", "webhook"])
        ),
        names(&["webhook:billing", "webhook:orders", "webhook", "email"])
    );
}
