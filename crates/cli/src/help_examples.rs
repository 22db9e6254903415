//! One or more example invocations per command, by command path.

pub fn for_path(path: &str) -> Option<&'static str> {
    EXAMPLES.iter().find(|(p, _)| *p == path).map(|(_, e)| *e)
}

const EXAMPLES: &[(&str, &str)] = &[];
