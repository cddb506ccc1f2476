//! Subcommands whose arguments clap builds only when that subcommand is the one given.
//!
//! Building every subcommand's arguments took 240–300 µs of each `corehop run`'s start here,
//! a third of what corehop adds before the program runs (`docs/performance.md`). Wrapped in
//! [`Deferred`] or [`DeferredSub`], a subcommand keeps its name and its one-line help in the
//! top-level list, and clap builds the rest with [`clap::Command::defer`] when it is chosen.

use clap::{ArgMatches, Args, Command, FromArgMatches, Subcommand};

/// The arguments `T` of one subcommand, built when that subcommand is chosen.
pub struct Deferred<T>(pub T);

/// The subcommands `T` of one subcommand, built when that subcommand is chosen.
pub struct DeferredSub<T>(pub T);

/// Builds `T`'s arguments into `cmd`, keeping the help the enclosing variant gave `cmd` first
/// (without deferral the variant's comment is applied after `T`'s, so it wins).
fn build_args<T: Args>(cmd: Command) -> Command {
    keep_help(cmd, T::augment_args)
}

fn build_args_for_update<T: Args>(cmd: Command) -> Command {
    keep_help(cmd, T::augment_args_for_update)
}

fn build_subcommands<T: Subcommand>(cmd: Command) -> Command {
    keep_help(cmd, T::augment_subcommands)
}

fn build_subcommands_for_update<T: Subcommand>(cmd: Command) -> Command {
    keep_help(cmd, T::augment_subcommands_for_update)
}

fn keep_help(cmd: Command, build: fn(Command) -> Command) -> Command {
    let about = cmd.get_about().cloned();
    let long_about = cmd.get_long_about().cloned();
    let cmd = build(cmd);
    match (about, long_about) {
        (None, _) => cmd,
        (Some(about), Some(long_about)) => cmd.about(about).long_about(long_about),
        (Some(about), None) => cmd.about(about).long_about(None::<&str>),
    }
}

impl<T: Args> Args for Deferred<T> {
    fn augment_args(cmd: Command) -> Command {
        cmd.defer(build_args::<T>)
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        cmd.defer(build_args_for_update::<T>)
    }

    fn group_id() -> Option<clap::Id> {
        T::group_id()
    }
}

impl<T: Subcommand> Subcommand for DeferredSub<T> {
    fn augment_subcommands(cmd: Command) -> Command {
        cmd.defer(build_subcommands::<T>)
    }

    fn augment_subcommands_for_update(cmd: Command) -> Command {
        cmd.defer(build_subcommands_for_update::<T>)
    }

    fn has_subcommand(name: &str) -> bool {
        T::has_subcommand(name)
    }
}

/// Both wrappers are parsed as what they wrap.
macro_rules! from_arg_matches_as_wrapped {
    ($($wrapper:ident),*) => {$(
        impl<T: FromArgMatches> FromArgMatches for $wrapper<T> {
            fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
                T::from_arg_matches(matches).map($wrapper)
            }

            fn from_arg_matches_mut(matches: &mut ArgMatches) -> Result<Self, clap::Error> {
                T::from_arg_matches_mut(matches).map($wrapper)
            }

            fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
                self.0.update_from_arg_matches(matches)
            }

            fn update_from_arg_matches_mut(&mut self, matches: &mut ArgMatches) -> Result<(), clap::Error> {
                self.0.update_from_arg_matches_mut(matches)
            }
        }
    )*};
}

from_arg_matches_as_wrapped!(Deferred, DeferredSub);
