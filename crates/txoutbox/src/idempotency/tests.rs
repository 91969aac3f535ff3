use std::time::Duration;

use super::*;

fn config_error(result: Result<Scope>) -> String {
    match result {
        Err(Error::Config(line)) => line,
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

#[test]
fn a_zero_window_is_refused_naming_the_setting() -> Result<()> {
    let line = config_error(Scope::new("charges")?.with_window(Duration::ZERO));
    assert!(
        line.contains("window") && line.contains("charges"),
        "{line}"
    );
    Ok(())
}

#[test]
fn a_window_past_100_years_is_refused() -> Result<()> {
    let scope = Scope::new("charges")?;
    let line = config_error(
        scope
            .clone()
            .with_window(MAX_WINDOW + Duration::from_secs(1)),
    );
    assert!(line.contains("window"), "{line}");
    // Far enough that `now() + window` would overflow a Postgres timestamp.
    config_error(scope.clone().with_window(Duration::from_secs(u64::MAX)));
    assert_eq!(scope.with_window(MAX_WINDOW)?.window(), MAX_WINDOW);
    Ok(())
}

#[test]
fn a_window_of_a_week_is_accepted() -> Result<()> {
    let week = Duration::from_secs(7 * 86_400);
    let scope = Scope::new("batch")?.with_window(week)?;
    assert_eq!(scope.window(), week);
    Ok(())
}

#[test]
fn a_zero_lock_timeout_is_refused_naming_the_setting() -> Result<()> {
    // Postgres reads lock_timeout = 0 as "wait forever".
    let line = config_error(Scope::new("charges")?.with_lock_timeout(Duration::ZERO));
    assert!(line.contains("lock timeout"), "{line}");
    Ok(())
}

#[test]
fn an_absurd_lock_timeout_is_refused() -> Result<()> {
    let scope = Scope::new("charges")?;
    config_error(scope.clone().with_lock_timeout(Duration::from_secs(3600)));
    config_error(
        scope
            .clone()
            .with_lock_timeout(Duration::from_secs(u64::MAX)),
    );
    let ok = scope.with_lock_timeout(MAX_LOCK_TIMEOUT)?;
    assert_eq!(ok.lock_timeout(), MAX_LOCK_TIMEOUT);
    Ok(())
}

#[test]
fn the_shortest_key_defaults_to_16_and_can_be_lowered() -> Result<()> {
    let scope = Scope::new("charges")?;
    assert_eq!(scope.min_key_len(), DEFAULT_MIN_KEY_LEN);
    let short = IdempotencyKey::parse("order-42")?;
    assert_eq!(
        scope.check_key(&short),
        Err(KeyError::TooShort { len: 8, min: 16 })
    );
    let lowered = scope.clone().with_min_key_len(8)?;
    assert_eq!(lowered.check_key(&short), Ok(()));
    let line = config_error(scope.clone().with_min_key_len(0));
    assert!(line.contains("shortest key"), "{line}");
    config_error(scope.with_min_key_len(MAX_KEY_LEN + 1));
    Ok(())
}
