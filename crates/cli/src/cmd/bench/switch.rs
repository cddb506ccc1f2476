//! `corehop bench switch` (lands with its issue).

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("corehop bench switch is not built yet")
}
