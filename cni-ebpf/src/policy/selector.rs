//! Label selectors (`metav1.LabelSelector`) as NetworkPolicy uses them.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

/// Labels of an object, as a selector reads them.
pub trait LabelSet {
    /// The value of label `key`, if the object has it.
    fn label(&self, key: &str) -> Option<&str>;
}

impl LabelSet for BTreeMap<String, String> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

/// A label selector checked once for validity: `matchLabels` and `matchExpressions`
/// (operators `In`, `NotIn`, `Exists`, `DoesNotExist`), all of which must hold. The empty
/// selector matches every object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    labels: Vec<(String, String)>,
    expressions: Vec<Expression>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Expression {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Selector {
    /// The selector that matches everything.
    #[must_use]
    pub fn everything() -> Self {
        Self {
            labels: Vec::new(),
            expressions: Vec::new(),
        }
    }

    /// Parses an API selector; an operator the API does not define, or `In`/`NotIn`
    /// without values (which the API server refuses), is an error naming it.
    pub fn parse(s: &LabelSelector) -> Result<Self, String> {
        let labels = s
            .match_labels
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let expressions = s
            .match_expressions
            .iter()
            .flatten()
            .map(expression)
            .collect::<Result<_, _>>()?;
        Ok(Self {
            labels,
            expressions,
        })
    }

    /// Whether an object with `labels` is selected.
    #[must_use]
    pub fn matches(&self, labels: &(impl LabelSet + ?Sized)) -> bool {
        let has = |k: &str, v: &str| labels.label(k) == Some(v);
        self.labels.iter().all(|(k, v)| has(k, v))
            && self.expressions.iter().all(|e| match e {
                Expression::In(k, vs) => labels.label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
                Expression::NotIn(k, vs) => {
                    labels.label(k).is_none_or(|l| !vs.iter().any(|v| v == l))
                }
                Expression::Exists(k) => labels.label(k).is_some(),
                Expression::DoesNotExist(k) => labels.label(k).is_none(),
            })
    }

    /// Whether it matches every object (no labels, no expressions).
    #[must_use]
    pub fn is_everything(&self) -> bool {
        self.labels.is_empty() && self.expressions.is_empty()
    }
}

fn expression(r: &LabelSelectorRequirement) -> Result<Expression, String> {
    let values = r.values.clone().unwrap_or_default();
    let key = r.key.clone();
    match r.operator.as_str() {
        "In" | "NotIn" if values.is_empty() => Err(format!(
            "matchExpressions: operator {} on key {key:?} needs values",
            r.operator
        )),
        "In" => Ok(Expression::In(key, values)),
        "NotIn" => Ok(Expression::NotIn(key, values)),
        "Exists" => Ok(Expression::Exists(key)),
        "DoesNotExist" => Ok(Expression::DoesNotExist(key)),
        other => Err(format!(
            "matchExpressions: unknown operator {other:?} on key {key:?}"
        )),
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn req(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.to_owned(),
            operator: op.to_owned(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect()),
        }
    }

    #[test]
    fn empty_selector_matches_everything() {
        let s = Selector::parse(&LabelSelector::default()).unwrap();
        assert!(s.matches(&labels(&[])));
        assert!(s.matches(&labels(&[("a", "b")])));
    }

    #[test]
    fn labels_and_expressions_must_all_hold() {
        let s = Selector::parse(&LabelSelector {
            match_labels: Some(labels(&[("app", "web")])),
            match_expressions: Some(vec![
                req("tier", "In", &["fe", "be"]),
                req("env", "NotIn", &["prod"]),
                req("team", "Exists", &[]),
                req("legacy", "DoesNotExist", &[]),
            ]),
        })
        .unwrap();
        let ok = labels(&[("app", "web"), ("tier", "fe"), ("team", "t")]);
        assert!(s.matches(&ok), "NotIn matches a missing key");
        let mut bad = ok.clone();
        bad.insert("env".into(), "prod".into());
        assert!(!s.matches(&bad));
        let mut bad = ok.clone();
        bad.insert("legacy".into(), "x".into());
        assert!(!s.matches(&bad));
        let mut bad = ok.clone();
        bad.remove("team");
        assert!(!s.matches(&bad));
        let mut bad = ok;
        bad.insert("tier".into(), "db".into());
        assert!(!s.matches(&bad));
    }

    #[test]
    fn malformed_requirements_are_named() {
        let e = Selector::parse(&LabelSelector {
            match_expressions: Some(vec![req("k", "Equals", &["v"])]),
            ..LabelSelector::default()
        })
        .unwrap_err();
        assert!(e.contains("Equals") && e.contains("\"k\""), "{e}");
        let e = Selector::parse(&LabelSelector {
            match_expressions: Some(vec![req("k", "In", &[])]),
            ..LabelSelector::default()
        })
        .unwrap_err();
        assert!(e.contains("needs values"), "{e}");
    }
}
