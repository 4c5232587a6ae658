//! `fairlock completions SHELL`: a completion script generated from the command line's own
//! definition, so it can never fall behind a new option.

use std::io::Write as _;

use clap::CommandFactory;
use clap_complete::Shell;

use crate::args::Cli;
use crate::exit::{Failure, INTERNAL, OK};

/// Prints the completion script for `shell` on stdout.
pub(crate) fn print(shell: Shell) -> Result<u8, Failure> {
    let script = script(shell);
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(&script)
        .and_then(|()| stdout.flush())
        .map_err(|err| Failure::new(INTERNAL, format!("cannot write the script: {err}")))?;
    Ok(OK)
}

/// The completion script for `shell`.
fn script(shell: Shell) -> Vec<u8> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "fairlock", &mut script);
    script
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shell_gets_a_script_naming_every_subcommand() {
        for shell in [
            Shell::Bash,
            Shell::Zsh,
            Shell::Fish,
            Shell::Elvish,
            Shell::PowerShell,
        ] {
            let script = String::from_utf8(script(shell)).unwrap();
            for word in [
                "exec",
                "status",
                "list",
                "force-unlock",
                "completions",
                "wait",
            ] {
                assert!(script.contains(word), "{shell}: {word:?} missing");
            }
        }
    }
}
