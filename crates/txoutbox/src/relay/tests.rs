use super::give_back::MAX_TEXT;
use super::*;

#[test]
fn storable_text_has_no_nul_and_a_bounded_length() {
    assert_eq!(storable("a\0b".into()), "a\u{FFFD}b");
    let long = "é".repeat(5000);
    let stored = storable(long);
    assert!(stored.len() < MAX_TEXT + 40, "{}", stored.len());
    assert!(stored.ends_with("(10000 bytes in all)"));
    assert_eq!(storable("fine".into()), "fine");
}

#[test]
fn the_call_limit_leaves_a_margin_for_the_completion() {
    let config = |lease| RelayConfig {
        lease,
        ..RelayConfig::default()
    };
    assert_eq!(
        config(Duration::from_secs(30)).call_limit(),
        Duration::from_secs(28)
    );
    assert_eq!(
        config(Duration::from_secs(1)).call_limit(),
        Duration::from_millis(800)
    );
}

#[test]
fn outcomes_are_stored_by_their_column_value() {
    let all = [
        Outcome::Delivered,
        Outcome::Retry,
        Outcome::Failed,
        Outcome::Unknown,
        Outcome::Released,
        Outcome::Unstarted,
    ];
    let names: Vec<_> = all.iter().map(|o| o.as_str()).collect();
    assert_eq!(
        names,
        [
            "delivered",
            "retry",
            "failed",
            "unknown",
            "released",
            "unstarted"
        ]
    );
}
