//! A strict walk over one YAML document: every node knows its path (`a.b[0].c`) and line, a
//! mapping refuses every key nobody asked for, and a value of the wrong kind is named. What
//! [`super::bootstrap`] reads Gardener's envoy.yaml with.
//!
//! Keys are compared in snake case: Envoy takes a protobuf field as `max_connections` or as
//! `maxConnections` (Gardener's template writes `circuitBreakers` and `maxConnections`), so
//! both spellings name the same field, and both at once are refused.

use std::time::Duration;

use saphyr::{LoadableYamlNode, MarkedYaml, Scalar, ScanError, YamlData};

/// Where in the document something is wrong, and what.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {}{problem}", field(.path))]
pub struct YamlError {
    /// 1-based line of the node (or of the key, for an unknown field).
    pub line: usize,
    /// The field path, e.g. `static_resources.listeners[0].address`; empty for the document.
    pub path: String,
    /// What is wrong.
    pub problem: Problem,
}

/// `PATH: ` before the problem, nothing for the document itself.
fn field(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("{path}: ")
    }
}

/// What is wrong with a node.
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    /// The text is not YAML (the scanner's reason in the message: a [`YamlError`] shows
    /// its problem, not a chain below it).
    #[error("not valid YAML: {0}")]
    Syntax(ScanError),
    /// Not exactly one document.
    #[error("{0} YAML documents (expected one)")]
    Documents(usize),
    /// The node is of another kind.
    #[error("expected {0}")]
    Expected(&'static str),
    /// A field this sidecar does not know; it cannot honour it.
    #[error("unknown field (this sidecar cannot honour it)")]
    Unknown,
    /// A required field is absent.
    #[error("missing field `{0}`")]
    Missing(&'static str),
    /// The same field twice (in both spellings).
    #[error("field given twice (snake and camel case)")]
    Twice,
    /// A value this sidecar does not implement.
    #[error("unsupported value {value:?} (this sidecar supports {supported})")]
    Unsupported {
        /// The value found.
        value: String,
        /// What would be accepted.
        supported: &'static str,
    },
    /// A value that does not parse or is out of range.
    #[error("invalid value {value:?}: {why}")]
    Invalid {
        /// The value found.
        value: String,
        /// Why.
        why: String,
    },
    /// The list has another length.
    #[error("expected {expected}, found {found} entries")]
    Count {
        /// What was expected, e.g. "exactly one entry".
        expected: &'static str,
        /// How many there are.
        found: usize,
    },
}

/// Parses `text` as exactly one YAML document (duplicate keys refused).
pub fn load(text: &str) -> Result<MarkedYaml<'_>, YamlError> {
    let docs = MarkedYaml::load_from_str(text).map_err(|e| YamlError {
        // The scanner may mark the end of the text one line past its last one.
        line: e.marker().line().clamp(1, line_count(text)),
        path: String::new(),
        problem: Problem::Syntax(e),
    })?;
    let count = docs.len();
    let mut docs = docs.into_iter();
    match (docs.next(), docs.next()) {
        (Some(doc), None) => Ok(doc),
        _ => Err(YamlError {
            line: 1,
            path: String::new(),
            problem: Problem::Documents(count),
        }),
    }
}

/// The lines of `text` as YAML counts them: `\r\n`, `\r` and `\n` each end one.
pub fn line_count(text: &str) -> usize {
    1 + text.replace("\r\n", "\n").matches(['\r', '\n']).count()
}

/// One node and where it is.
#[derive(Debug, Clone)]
pub struct Node<'a, 'i> {
    yaml: &'a MarkedYaml<'i>,
    path: String,
    /// The text's last line: the scanner may mark a node at the end of the text one line past
    /// it (found by the envoy_yaml fuzz target), and an error names a line the file has.
    last_line: usize,
}

impl<'a, 'i> Node<'a, 'i> {
    /// The root of `yaml`, the document [`load`] read from `text`.
    pub fn root(yaml: &'a MarkedYaml<'i>, text: &str) -> Self {
        Node {
            yaml,
            path: String::new(),
            last_line: line_count(text),
        }
    }

    /// `line` as a line of the text (1 to its last).
    fn line(&self, line: usize) -> usize {
        line.clamp(1, self.last_line)
    }

    /// The node's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// An error about this node.
    pub fn error(&self, problem: Problem) -> YamlError {
        YamlError {
            line: self.line(self.yaml.span.start.line()),
            path: self.path.clone(),
            problem,
        }
    }

    /// `Invalid` for this node's value.
    pub fn invalid(&self, why: impl Into<String>) -> YamlError {
        self.error(Problem::Invalid {
            value: self.display(),
            why: why.into(),
        })
    }

    /// `Unsupported` for this node's value.
    pub fn unsupported(&self, supported: &'static str) -> YamlError {
        self.error(Problem::Unsupported {
            value: self.display(),
            supported,
        })
    }

    fn display(&self) -> String {
        match &self.yaml.data {
            YamlData::Value(Scalar::String(s)) => s.to_string(),
            YamlData::Value(Scalar::Integer(i)) => i.to_string(),
            YamlData::Value(Scalar::Boolean(b)) => b.to_string(),
            YamlData::Value(Scalar::FloatingPoint(f)) => f.to_string(),
            YamlData::Value(Scalar::Null) => "null".into(),
            YamlData::Mapping(_) => "{…}".into(),
            YamlData::Sequence(_) => "[…]".into(),
            _ => "…".into(),
        }
    }

    /// The node as a mapping whose keys must all be taken before [`Map::finish`].
    pub fn map(&self) -> Result<Map<'a, 'i>, YamlError> {
        let YamlData::Mapping(m) = &self.yaml.data else {
            return Err(self.error(Problem::Expected("a mapping")));
        };
        let mut entries: Vec<Entry<'a, 'i>> = Vec::with_capacity(m.len());
        for (k, v) in m {
            let Some(raw) = k.data.as_str() else {
                return Err(YamlError {
                    line: self.line(k.span.start.line()),
                    path: self.path.clone(),
                    problem: Problem::Expected("a string key"),
                });
            };
            let key = snake_case(raw);
            let child = Node {
                yaml: v,
                path: join(&self.path, &key),
                last_line: self.last_line,
            };
            if entries.iter().any(|e| e.key == key) {
                return Err(child.error(Problem::Twice));
            }
            entries.push(Entry {
                key,
                key_line: self.line(k.span.start.line()),
                node: child,
                taken: false,
            });
        }
        Ok(Map {
            node: self.clone(),
            entries,
        })
    }

    /// The node as a sequence.
    pub fn seq(&self) -> Result<Vec<Node<'a, 'i>>, YamlError> {
        let YamlData::Sequence(s) = &self.yaml.data else {
            return Err(self.error(Problem::Expected("a list")));
        };
        Ok(s.iter()
            .enumerate()
            .map(|(i, yaml)| Node {
                yaml,
                path: format!("{}[{i}]", self.path),
                last_line: self.last_line,
            })
            .collect())
    }

    /// The node as a list of exactly one entry.
    pub fn one(&self) -> Result<Node<'a, 'i>, YamlError> {
        let mut items = self.seq()?;
        if items.len() != 1 {
            return Err(self.error(Problem::Count {
                expected: "exactly one entry",
                found: items.len(),
            }));
        }
        Ok(items.remove(0))
    }

    /// The node as a string (a plain scalar that reads as a number is refused).
    pub fn str(&self) -> Result<&'a str, YamlError> {
        match &self.yaml.data {
            YamlData::Value(Scalar::String(s)) => Ok(s.as_ref()),
            _ => Err(self.error(Problem::Expected("a string"))),
        }
    }

    /// The node as a string that must be `want`.
    pub fn expect_str(&self, want: &'static str) -> Result<(), YamlError> {
        if self.str()? == want {
            Ok(())
        } else {
            Err(self.unsupported(want))
        }
    }

    /// The node as a non-negative integer (a number, or digits in a string as protobuf's JSON
    /// mapping allows).
    pub fn uint(&self) -> Result<u64, YamlError> {
        match &self.yaml.data {
            YamlData::Value(Scalar::Integer(i)) => {
                u64::try_from(*i).map_err(|_| self.invalid("negative"))
            }
            YamlData::Value(Scalar::String(s)) if s.bytes().all(|b| b.is_ascii_digit()) => {
                s.parse().map_err(|_| self.invalid("out of range"))
            }
            _ => Err(self.error(Problem::Expected("a non-negative integer"))),
        }
    }

    /// The node as a boolean.
    pub fn bool(&self) -> Result<bool, YamlError> {
        match &self.yaml.data {
            YamlData::Value(Scalar::Boolean(b)) => Ok(*b),
            _ => Err(self.error(Problem::Expected("true or false"))),
        }
    }

    /// The node as a protobuf JSON duration: seconds with up to nine decimals and an `s`
    /// (`20s`, `0.25s`).
    pub fn duration(&self) -> Result<Duration, YamlError> {
        let text = self.str()?;
        let bad = || self.invalid("expected a duration like \"20s\" or \"0.25s\"");
        let number = text.strip_suffix('s').ok_or_else(bad)?;
        let (secs, frac) = number.split_once('.').unwrap_or((number, ""));
        if secs.is_empty()
            || frac.len() > 9
            || !secs.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
        {
            return Err(bad());
        }
        let secs: u64 = secs.parse().map_err(|_| bad())?;
        let nanos: u32 = format!("{frac:0<9}").parse().map_err(|_| bad())?;
        Ok(Duration::new(secs, nanos))
    }

    /// The node as an empty mapping (`{}`).
    pub fn empty(&self) -> Result<(), YamlError> {
        self.map()?.finish()
    }
}

struct Entry<'a, 'i> {
    key: String,
    key_line: usize,
    node: Node<'a, 'i>,
    taken: bool,
}

/// A mapping being read: [`Map::get`] and [`Map::req`] take fields, [`Map::finish`] refuses
/// the fields left.
pub struct Map<'a, 'i> {
    node: Node<'a, 'i>,
    entries: Vec<Entry<'a, 'i>>,
}

impl std::fmt::Debug for Map<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Map")
            .field("path", &self.node.path)
            .finish_non_exhaustive()
    }
}

impl<'a, 'i> Map<'a, 'i> {
    /// The field `key` (snake case), if present.
    pub fn get(&mut self, key: &str) -> Option<Node<'a, 'i>> {
        let entry = self.entries.iter_mut().find(|e| e.key == key)?;
        entry.taken = true;
        Some(entry.node.clone())
    }

    /// The field `key`, which must be present.
    pub fn req(&mut self, key: &'static str) -> Result<Node<'a, 'i>, YamlError> {
        self.get(key)
            .ok_or_else(|| self.node.error(Problem::Missing(key)))
    }

    /// Accepts `key` whatever its value (a field known to make no difference here).
    pub fn ignore(&mut self, key: &str) {
        let _ = self.get(key);
    }

    /// The first field nobody took is an error.
    pub fn finish(self) -> Result<(), YamlError> {
        match self.entries.into_iter().find(|e| !e.taken) {
            None => Ok(()),
            Some(e) => Err(YamlError {
                line: e.key_line,
                path: e.node.path,
                problem: Problem::Unknown,
            }),
        }
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// `maxConnections` → `max_connections`; snake case and `@type` stay as they are.
pub(super) fn snake_case(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 4);
    for c in key.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_errors_name_the_line_and_the_scanners_reason() {
        for (text, line, says) in [
            ("a:\n  b: [\n", 3, "not valid YAML: "),
            ("a: 1\na: 2\n", 2, "not valid YAML: duplicated key"),
            ("a: 1\n---\nb: 2\n", 1, "2 YAML documents"),
        ] {
            let err = load(text).expect_err(text);
            let shown = err.to_string();
            assert_eq!(err.line, line, "{text:?}: {shown}");
            // The document has no field path: nothing between the line and the problem.
            assert!(
                shown.starts_with(&format!("line {line}: {says}")),
                "{text:?}: {shown}"
            );
        }
    }

    #[test]
    fn paths_lines_and_unknown_fields() {
        let text = "a:\n  maxConnections: 3\n  list:\n  - x: \"1\"\n    y: 2\n";
        let doc = load(text).unwrap();
        let mut root = Node::root(&doc, text).map().unwrap();
        let mut a = root.req("a").unwrap().map().unwrap();
        assert_eq!(a.req("max_connections").unwrap().uint().unwrap(), 3);
        let item = a.req("list").unwrap().one().unwrap();
        let mut item = item.map().unwrap();
        assert_eq!(item.req("x").unwrap().uint().unwrap(), 1);
        let e = item.finish().unwrap_err();
        assert_eq!((e.line, e.path.as_str()), (5, "a.list[0].y"));
        assert!(matches!(e.problem, Problem::Unknown));
        assert_eq!(
            e.to_string(),
            "line 5: a.list[0].y: unknown field (this sidecar cannot honour it)"
        );
    }

    #[test]
    fn both_spellings_and_duplicates_are_refused() {
        let text = "a: 1\nmax_hosts: 2\nmaxHosts: 3\n";
        let doc = load(text).unwrap();
        let e = Node::root(&doc, text).map().unwrap_err();
        assert!(matches!(e.problem, Problem::Twice), "{e}");
        assert_eq!(e.line, 3);
        let e = load("a: 1\na: 2\n").unwrap_err();
        assert!(matches!(e.problem, Problem::Syntax(_)), "{e}");
        assert!(load("a: [1\n").is_err());
        assert!(matches!(
            load("a: 1\n---\nb: 2\n").unwrap_err().problem,
            Problem::Documents(2)
        ));
    }

    #[test]
    fn scalars() {
        let text = "d: 0.25s\ne: 20s\nf: 20\ng: '-1'\nh: true\ni: 1.5s5\n";
        let doc = load(text).unwrap();
        let mut m = Node::root(&doc, text).map().unwrap();
        assert_eq!(
            m.req("d").unwrap().duration().unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(
            m.req("e").unwrap().duration().unwrap(),
            Duration::from_secs(20)
        );
        assert!(m.req("f").unwrap().duration().is_err());
        assert!(m.req("f").unwrap().str().is_err());
        assert!(m.req("g").unwrap().uint().is_err());
        assert!(m.req("h").unwrap().bool().unwrap());
        assert!(m.req("i").unwrap().duration().is_err());
        m.finish().unwrap();
    }

    #[test]
    fn a_node_at_the_end_names_the_last_line() {
        // Found by the envoy_yaml fuzz target: the key after `?` is marked at line 11 of a
        // 10-line text (its last line is a comment without a newline).
        let text = include_str!("../../fixtures/fuzz-envoy-yaml-key-past-end.yaml");
        let doc = load(text).unwrap();
        let e = Node::root(&doc, text).map().unwrap_err();
        assert!(
            matches!(e.problem, Problem::Expected("a string key")),
            "{e}"
        );
        assert_eq!(e.line, 10, "{e}");
        assert!(e.to_string().starts_with("line 10: "), "{e}");
    }

    #[test]
    fn a_syntax_error_at_the_end_names_the_last_line() {
        // Found by the envoy_yaml fuzz target: the scanner marked line 58 of a 57-line text.
        let text = include_str!("../../fixtures/fuzz-envoy-yaml-line-past-end.yaml");
        let e = load(text).unwrap_err();
        assert_eq!(e.line, 57, "{e}");
        assert!(
            e.to_string()
                .starts_with(&format!("line {}: not valid YAML", e.line)),
            "{e}"
        );
    }
}
