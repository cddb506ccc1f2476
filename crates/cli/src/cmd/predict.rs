//! `corehop predict` (lands with its issue).

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("corehop predict is not built yet")
}
