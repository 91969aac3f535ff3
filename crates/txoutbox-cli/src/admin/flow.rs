//! `txoutbox pause` and `txoutbox resume`: an operator's stop of a destination, stored in the
//! database so that every relay obeys it.

use anyhow::Result;
use clap::Args;
use tokio_postgres::Client;

pub(super) const PAUSE_HELP: &str = "\
A pause is stored in the database: every relay obeys it at its next claim (within one poll
interval); calls already out finish. Paused rows stay pending, unleased, and spend no attempt.
Each pause and resume is logged in the attempt log under the destination, with --reason and
--by (default: $USER). `txoutbox stats` shows paused destinations and open breakers.

A destination that no message, flow-control state or earlier pause names is refused (exit 2)
with the known ones, closest first: a typo must not pause nothing while the real one flows.
--force pauses it anyway (a destination about to be used).

Examples:
  txoutbox pause stripe --reason 'Stripe incident INC-42'
  txoutbox resume stripe";

/// Options of `txoutbox pause`.
#[derive(Debug, Args)]
pub struct PauseArgs {
    /// The destination to pause (as the relay's sinks name it: stripe, email, webhook:orders).
    destination: String,
    /// Why (shown by `stats`, kept in the attempt log).
    #[arg(long)]
    reason: String,
    /// Who pauses it (default: $USER).
    #[arg(long)]
    by: Option<String>,
    /// Pause it even though nothing names it yet (a destination about to be used).
    #[arg(long)]
    force: bool,
}

/// Options of `txoutbox resume`.
#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// The destination to resume.
    destination: String,
    /// Who resumes it (default: $USER).
    #[arg(long)]
    by: Option<String>,
    /// Skip the check that something names the destination.
    #[arg(long)]
    force: bool,
}

/// Who runs the command, for the attempt log: `--by`, else `$USER`.
fn operator(by: Option<String>) -> Option<String> {
    by.or_else(|| std::env::var("USER").ok())
        .filter(|u| !u.trim().is_empty())
}

/// Refuses a destination nothing names (unless `force`): the refusal is a usage error (exit 2)
/// listing the known destinations, closest first.
async fn known(client: &Client, destination: &str, force: bool) -> Result<()> {
    if force {
        return Ok(());
    }
    match txoutbox::admin::require_known_destination(client, destination, &[]).await {
        Err(e @ txoutbox::admin::AdminError::UnknownDestination { .. }) => Err(crate::Usage(
            format!("{e} (check the name, or pass --force for a destination about to be used)"),
        )
        .into()),
        other => Ok(other?),
    }
}

/// `txoutbox pause`: pauses the destination for every relay.
pub(super) async fn pause(client: &mut Client, args: PauseArgs, out: &mut String) -> Result<()> {
    known(client, &args.destination, args.force).await?;
    let by = operator(args.by);
    let flow =
        txoutbox::admin::pause_destination(client, &args.destination, &args.reason, by.as_deref())
            .await?;
    out.push_str(&format!(
        "paused {}: every relay stops calling it at its next claim (txoutbox resume {} to end)\n",
        flow.destination, flow.destination
    ));
    Ok(())
}

/// `txoutbox resume`: ends the pause.
pub(super) async fn resume(client: &mut Client, args: ResumeArgs, out: &mut String) -> Result<()> {
    known(client, &args.destination, args.force).await?;
    let by = operator(args.by);
    let flow =
        txoutbox::admin::resume_destination(client, &args.destination, by.as_deref()).await?;
    out.push_str(&format!("resumed {} ({})\n", flow.destination, flow.state));
    Ok(())
}
