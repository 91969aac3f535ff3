//! The `ratio:` lines a run ends with: the one-row path against its baselines, the median of
//! several rounds, the sqlx modes against tokio-postgres.

use super::{command, Args, Mode};
use crate::ratio::Ratio;

/// The round whose one-row ratio to the business insert is the median (the lower middle one
/// for an even count; the last round when the one-row path did not run); with several rounds,
/// prints each round's ratio and load beside the median.
pub(super) fn median_round(args: &Args, clients: usize, mut rounds: Vec<Ratios>) -> Ratios {
    let of = |r: &Ratios| r.one_row.and_then(|(business, _, _)| business.value());
    let each: Option<Vec<String>> = rounds
        .iter()
        .map(|r| Some(format!("{:.2} (load {})", of(r)?, r.load)))
        .collect();
    let Some(each) = each.filter(|each| each.len() > 1) else {
        return rounds.pop().unwrap_or_default();
    };
    rounds.sort_by(|a, b| of(a).unwrap_or(0.0).total_cmp(&of(b).unwrap_or(0.0)));
    let median = rounds.swap_remove((rounds.len() - 1) / 2);
    println!(
        "ratio by round: {} (full path with one row per request / business insert only, \
         {clients} clients); median {:.2}  {}",
        each.join(", "),
        of(&median).unwrap_or(0.0),
        command(args, clients)
    );
    median
}

/// The `ratio:` lines of the `--ratio-at` client count (`n/a` for a baseline not measured).
pub(super) fn print_ratios(args: &Args, ratio: &Ratios) {
    let reproduce = command(args, args.ratio_at);
    match ratio.one_row {
        Some((business, hand, same_trips)) => {
            let median = if args.rounds > 1 {
                format!(", the median of {} rounds", args.rounds)
            } else {
                String::new()
            };
            println!(
                "ratio: {business} (full path with one row per request: deferred effects, \
                 Claim::commit / business insert only, {} clients{median})  {reproduce}",
                args.ratio_at
            );
            println!(
                "ratio to hand-written SQL: {hand} (the same / the cheapest hand-written SQL \
                 storing the same information, {} clients)  {reproduce}",
                args.ratio_at
            );
            println!(
                "ratio to hand-written SQL with the same round trips: {same_trips} (the same / \
                 hand-written SQL, one row, {} clients)  {reproduce}",
                args.ratio_at
            );
        }
        None => println!(
            "ratio: n/a (no full-one-row run at {} clients)",
            args.ratio_at
        ),
    }
    if !ratio.sqlx.is_empty() {
        let pairs: Vec<String> = ratio
            .sqlx
            .iter()
            .map(|(mode, r)| format!("{} {r}", mode.name().trim_start_matches("sqlx: ")))
            .collect();
        println!(
            "ratio sqlx / tokio-postgres: {} (the same work on each driver, {} clients)  \
             {reproduce}",
            pairs.join(", "),
            args.ratio_at
        );
    }
    if let Some(after_begin) = ratio.after_begin {
        println!(
            "ratio with the insert after begin: {after_begin} (the one-row path as the examples \
             write a handler, a round trip more / business insert only, {} clients)  \
             {reproduce}",
            args.ratio_at
        );
    }
    if let Some(rows) = ratio.rows {
        println!(
            "ratio with the effects as rows at commit: {rows} (full path, begin and complete \
             one after the other / business insert only, {} clients)  {reproduce}",
            args.ratio_at
        );
    }
}

/// The ratios the run ends with.
#[derive(Default)]
pub(super) struct Ratios {
    /// [`Mode::FullOneRow`] against the business insert, the cheapest hand-written SQL and the
    /// hand-written SQL with the same round trips.
    pub(super) one_row: Option<(Ratio, Ratio, Ratio)>,
    /// [`Mode::Full`] against the business insert.
    pub(super) rows: Option<Ratio>,
    /// [`Mode::FullOneRowAfterBegin`] against the business insert.
    pub(super) after_begin: Option<Ratio>,
    /// Each sqlx mode against the same work on tokio-postgres (deadpool).
    pub(super) sqlx: Vec<(Mode, Ratio)>,
    /// The machine's load averages when the round ended.
    pub(super) load: String,
}
