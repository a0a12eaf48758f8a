//! The contexts file's rules and the resolution of connection options.

use std::path::PathBuf;

use super::{ConnectArgs, Context, Contexts};
use crate::Trust;

fn ctx(addr: &str) -> Context {
    Context {
        addr: addr.into(),
        pin: Some("ab".repeat(32)),
        ..Context::default()
    }
}

fn two() -> Contexts {
    let mut c = Contexts::default();
    c.add("prod", ctx("prod.example:7420")).unwrap();
    c.add(
        "staging",
        Context {
            addr: "staging.example:7420".into(),
            data: Some("/srv/muster".into()),
            ..Context::default()
        },
    )
    .unwrap();
    c
}

#[test]
fn contexts_round_trip_through_the_file_and_the_first_is_current() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("muster").join("contexts.toml");
    assert_eq!(Contexts::load(&path).unwrap(), Contexts::default());
    let c = two();
    assert_eq!(c.current.as_deref(), Some("prod"));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, toml::to_string(&c).unwrap()).unwrap();
    let back = Contexts::load(&path).unwrap();
    assert_eq!(back, c);
    assert_eq!(
        back.selected(Some("staging"))
            .unwrap()
            .map(|c| c.addr.as_str()),
        Some("staging.example:7420")
    );
    assert_eq!(
        back.selected(None).unwrap().map(|c| c.addr.as_str()),
        Some("prod.example:7420")
    );
    let mut back = back;
    back.remove("prod").unwrap();
    assert_eq!(back.current, None);
    assert_eq!(back.selected(None).unwrap(), None);
    assert_eq!(
        back.use_context("prod").unwrap_err().to_string(),
        "no context \"prod\" (see `muster context list`)"
    );
    assert_eq!(
        back.add("bad name", ctx("x:1")).unwrap_err().to_string(),
        "invalid context name \"bad name\": want [A-Za-z0-9._-]{1,64}"
    );
}

#[test]
fn a_broken_file_is_an_error_not_an_empty_list() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("contexts.toml");
    std::fs::write(&path, "current = \"gone\"\n").unwrap();
    let e = Contexts::load(&path).unwrap_err();
    assert!(
        e.to_string()
            .ends_with("contexts.toml: current context \"gone\" is not defined"),
        "{e}"
    );
    std::fs::write(&path, "[contexts.a]\naddr = 1\n").unwrap();
    let e = Contexts::load(&path).unwrap_err();
    assert!(e.to_string().starts_with("reading "), "{e}");
}

/// Checks the address and the trust `args` resolve to against `contexts`.
#[track_caller]
fn check(contexts: &Contexts, args: ConnectArgs, addr: &str, trust: &str) {
    let options = args.resolve_in(contexts).unwrap();
    let got = match &options.trust {
        Trust::Pin(pin) => format!("pin {pin}"),
        Trust::CaFile(ca) => format!("ca {}", ca.display()),
        Trust::DataDir(dir) => format!("data {}", dir.display()),
    };
    assert_eq!((options.addr.as_str(), got.as_str()), (addr, trust));
}

#[test]
fn given_options_win_over_the_context_in_use_and_trust_is_taken_whole() {
    let pin = format!("pin {}", "ab".repeat(32));
    let default_data = format!("data {}", crate::connect::default_data_dir().display());
    let none = Contexts::default();
    let c = two();
    // No context: the local daemon.
    check(
        &none,
        ConnectArgs::default(),
        "127.0.0.1:7420",
        &default_data,
    );
    // The current context, a named one, and an address given over the context's.
    check(&c, ConnectArgs::default(), "prod.example:7420", &pin);
    let staging = || ConnectArgs {
        context: Some("staging".into()),
        ..ConnectArgs::default()
    };
    check(&c, staging(), "staging.example:7420", "data /srv/muster");
    let addr = ConnectArgs {
        addr: Some("10.0.0.1:7420".into()),
        ..staging()
    };
    check(&c, addr, "10.0.0.1:7420", "data /srv/muster");
    // Any trust given replaces the context's whole (its pin is not kept beside a data
    // directory given); a pin beats a CA file beats a data directory.
    let data = ConnectArgs {
        data: Some("/tmp/d".into()),
        ..ConnectArgs::default()
    };
    check(&c, data.clone(), "prod.example:7420", "data /tmp/d");
    let ca = ConnectArgs {
        ca: Some("/tmp/ca.pem".into()),
        ..data
    };
    check(&c, ca.clone(), "prod.example:7420", "ca /tmp/ca.pem");
    let pinned = ConnectArgs {
        pin: Some("cd".into()),
        ..ca
    };
    check(&c, pinned, "prod.example:7420", "pin cd");
    // A context named but not defined is an error, with or without a file.
    let nope = ConnectArgs {
        context: Some("nope".into()),
        ..ConnectArgs::default()
    };
    for contexts in [&none, &c] {
        assert_eq!(
            nope.resolve_in(contexts).unwrap_err().to_string(),
            "no context \"nope\" (see `muster context list`)"
        );
    }
}

#[test]
fn arguments_win_over_the_environment_field_by_field() {
    let given = ConnectArgs {
        addr: Some("a:1".into()),
        token_file: Some(PathBuf::from("/t")),
        ..ConnectArgs::default()
    };
    let env = ConnectArgs {
        context: Some("prod".into()),
        addr: Some("b:2".into()),
        pin: Some("cd".into()),
        token: Some("secret".into()),
        ..ConnectArgs::default()
    };
    assert_eq!(
        given.or(env),
        ConnectArgs {
            context: Some("prod".into()),
            addr: Some("a:1".into()),
            pin: Some("cd".into()),
            token: Some("secret".into()),
            token_file: Some(PathBuf::from("/t")),
            ..ConnectArgs::default()
        }
    );
}
