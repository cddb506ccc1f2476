//! `corehop topo`.

#[derive(clap::Args)]
pub struct Args {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let _ = args.json;
    anyhow::bail!("corehop topo: discovery lands with the topology work")
}
