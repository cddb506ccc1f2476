//! `corehop sim` (lands with its issue).

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("corehop sim is not built yet")
}
