//! `corehop bench pipeline` (lands with its issue).

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("corehop bench pipeline is not built yet")
}
