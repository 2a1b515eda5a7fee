//! The parameters with where each value came from (a default, a board profile, an override),
//! as every result prints them.

use super::params::{index, Params, SPECS};

/// Where a parameter's value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    Default,
    /// A board profile (its path) that measured it.
    Profile(String),
    /// A board profile (its path) whose check could not measure it: the model's value when the
    /// profile was written.
    ProfileKept(String),
    /// Fitted to a board profile's measurement array: the profile's path and how.
    ProfileFit {
        path: String,
        how: String,
    },
    /// Given on the command line.
    Override,
}

/// What a board profile says about the board it was written on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProfileInfo {
    pub path: String,
    pub backend: String,
    pub runtime_version: String,
    pub all_bit_exact: Option<bool>,
    /// The parameters the board check measured (the profile's `measured` list); the others carry
    /// the model's values. `None`: the profile does not say, every parameter counts as measured.
    pub measured: Option<Vec<String>>,
}

/// Parameters with the origin of each value.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub params: Params,
    /// Indexed like [`SPECS`].
    pub origins: Vec<Origin>,
    pub profile: Option<ProfileInfo>,
    /// Parameters a board profile's measurements could not be fitted to, and why: each keeps the
    /// value its origin gives.
    pub rejected_fits: Vec<(&'static str, String)>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            params: Params::default(),
            origins: vec![Origin::Default; SPECS.len()],
            profile: None,
            rejected_fits: Vec::new(),
        }
    }
}

impl Settings {
    /// Applies `name=value`.
    pub fn apply_override(&mut self, assignment: &str) -> Result<(), String> {
        let (name, value) = assignment
            .split_once('=')
            .ok_or_else(|| format!("{assignment:?} is not NAME=VALUE"))?;
        let (name, value) = (name.trim(), value.trim());
        let x: f64 = value
            .parse()
            .map_err(|_| format!("{name}: {value:?} is not a number"))?;
        self.params.set(name, x)?;
        self.origins[index(name).expect("set checked the name")] = Origin::Override;
        self.rejected_fits.retain(|(n, _)| *n != name);
        Ok(())
    }

    /// One line per parameter: name, value, unit, and where the value came from (the source
    /// text for defaults), with the reason a fit to the profile's measurements was rejected.
    pub fn describe(&self) -> Vec<String> {
        SPECS
            .iter()
            .zip(&self.origins)
            .map(|(s, o)| {
                let v = self.params.get(s.name).expect("every spec has a field");
                let mut from = match o {
                    Origin::Default => s.source.to_string(),
                    Origin::Profile(p) => format!("board profile {p}"),
                    Origin::ProfileKept(p) => {
                        format!("board profile {p}, not measured there: the model's value")
                    }
                    Origin::ProfileFit { path, how } => format!("board profile {path}: {how}"),
                    Origin::Override => "set on the command line".to_string(),
                };
                if let Some((_, why)) = self.rejected_fits.iter().find(|r| r.0 == s.name) {
                    from = format!("fit rejected ({why}), so: {from}");
                }
                format!(
                    "{:<28} {:>10} {:<12} {}",
                    s.name,
                    fmt_value(v),
                    s.unit,
                    from
                )
            })
            .collect()
    }
}

fn fmt_value(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e9 {
        format!("{v:.0}")
    } else {
        format!("{v:.4}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_name_a_parameter_and_a_number() {
        let mut s = Settings::default();
        s.apply_override("shared_dram_gbps=25").unwrap();
        assert_eq!(s.params.shared_dram_gbps, 25.0);
        assert_eq!(
            s.origins[index("shared_dram_gbps").unwrap()],
            Origin::Override
        );
        for bad in ["shared_dram_gbps", "nope=1", "core_tops=x", "cores=0"] {
            assert!(s.apply_override(bad).is_err(), "{bad}");
        }
    }
}
