//! `corehop bench o2` (lands with its issue).

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("corehop bench o2 is not built yet")
}
