//! A pipeline as a directed acyclic graph of stages (docs/topologies.md): each stage reads
//! topics or the outputs of earlier stages and writes named outputs, each bound to a topic or
//! read by later stages through an internal topic Weir owns (as Kafka Streams' repartition
//! topics). This module checks a graph's shape — every problem at once — and orders its stages
//! so that each comes after the stages it reads; the settings of `weir run`
//! (`config::stages`) and, later, the API's spec describe their stages to it.
//!
//! Every operator emits to [`DEFAULT_OUTPUT`]; one of `weir:operator@0.3.0` also to the named
//! outputs it declares, which a stage binds like its default one. Whether a stage's operator
//! declares the outputs its stage binds is checked when it starts ([`bind_outputs`]).

use std::collections::{BTreeMap, BTreeSet};

/// The output every operator emits to (`emit.emit`): its only one before `weir:operator@0.3.0`.
pub const DEFAULT_OUTPUT: &str = "default";

/// Most stages in one pipeline.
pub const STAGES_MAX: usize = 32;

/// Longest stage or output name, bytes.
const NAME_BYTES_MAX: usize = 64;

/// Where a stage's input comes from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Input<'a> {
    /// A topic the pipeline does not write.
    Topic(&'a str),
    /// The output `output` of stage `stage`.
    Stage {
        /// The stage that writes it.
        stage: &'a str,
        /// Its output's name.
        output: &'a str,
    },
}

/// As the problems name it: ``topic `t` `` or ``stage `s` (output `o`)``.
impl std::fmt::Display for Input<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Input::Topic(topic) => write!(f, "topic `{topic}`"),
            Input::Stage { stage, output } => write!(f, "stage `{stage}` (output `{output}`)"),
        }
    }
}

/// One stage as the graph sees it: its name, its inputs and the outputs it binds to topics.
#[derive(Debug, Clone)]
pub struct Node<'a> {
    /// The stage's name: 1..=64 bytes of `[a-z0-9_-]`, unique in the pipeline.
    pub name: &'a str,
    /// Its inputs, at least one; co-partitioned (checked when the topics are known).
    pub inputs: Vec<Input<'a>>,
    /// Its outputs that go to a topic of the user's: output name → topic.
    pub topics: BTreeMap<&'a str, &'a str>,
}

/// Whether `name` is a valid stage or output name: 1..=64 bytes of `[a-z0-9_-]` (it is part of
/// topic, consumer group and transactional ids).
pub fn valid_name(name: &str) -> bool {
    (1..=NAME_BYTES_MAX).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// A checked graph: its stages in an order where each comes after every stage it reads
/// (declaration order among those free to go), and its edges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    /// Indices into the checked nodes.
    pub stages: Vec<usize>,
    /// The outputs other stages read (stage index, output name), each once, which are not
    /// bound to a user's topic: each is an internal topic.
    pub internal: Vec<(usize, String)>,
}

/// Checks the graph of `nodes` (in declaration order) and orders it.
///
/// # Errors
/// Every problem found, each naming its stage (`stages[i]` for one without a valid name):
/// too few or too many stages; an invalid or repeated name; a stage with no input; an input of
/// an unknown stage or an invalid output name; a `default` output that goes nowhere; a topic both written and read by the pipeline; a cycle.
pub fn check(nodes: &[Node<'_>]) -> Result<Order, Vec<String>> {
    let mut problems = Vec::new();
    if !(1..=STAGES_MAX).contains(&nodes.len()) {
        problems.push(format!(
            "a pipeline has 1..={STAGES_MAX} stages. count={}",
            nodes.len()
        ));
    }
    let index = names(nodes, &mut problems);
    check_outputs(nodes, &mut problems);
    check_inputs(nodes, &index, &mut problems);
    let order = order(nodes, &index, &mut problems);
    // Two stages of one name can each make the same problem: it is named once.
    let mut named = BTreeSet::new();
    problems.retain(|p| named.insert(p.clone()));
    if problems.is_empty() {
        Ok(Order {
            stages: order,
            internal: internal_edges(nodes, &index),
        })
    } else {
        Err(problems)
    }
}

/// Each stage's index by name; problems for invalid and repeated names.
fn names<'a>(nodes: &[Node<'a>], problems: &mut Vec<String>) -> BTreeMap<&'a str, usize> {
    let mut index = BTreeMap::new();
    for (i, node) in nodes.iter().enumerate() {
        if !valid_name(node.name) {
            problems.push(format!(
                "stages[{i}].name must be 1..={NAME_BYTES_MAX} bytes of [a-z0-9_-]. name=`{}`",
                node.name
            ));
        } else if let std::collections::btree_map::Entry::Vacant(free) = index.entry(node.name) {
            free.insert(i);
        } else {
            problems.push(format!("stage `{}` is named twice", node.name));
        }
    }
    index
}

/// Outputs: valid names; [`DEFAULT_OUTPUT`] bound to a topic or read by a stage; no topic
/// written by one stage and read by another as a topic (that is an edge: read the stage).
fn check_outputs(nodes: &[Node<'_>], problems: &mut Vec<String>) {
    let read: BTreeSet<(&str, &str)> = nodes
        .iter()
        .flat_map(|n| &n.inputs)
        .filter_map(|input| match input {
            Input::Stage { stage, output } => Some((*stage, *output)),
            Input::Topic(_) => None,
        })
        .collect();
    let written: BTreeMap<&str, (&str, &str)> = nodes
        .iter()
        .flat_map(|n| {
            n.topics
                .iter()
                .map(|(output, topic)| (*topic, (n.name, *output)))
        })
        .collect();
    for node in nodes {
        for output in node.topics.keys() {
            if !valid_name(output) {
                problems.push(invalid_output(node.name, output));
            }
        }
        if !node.topics.contains_key(DEFAULT_OUTPUT) && !read.contains(&(node.name, DEFAULT_OUTPUT))
        {
            problems.push(format!(
                "the output `{DEFAULT_OUTPUT}` of stage `{}` goes nowhere: bind it to a topic or read it in another stage",
                node.name
            ));
        }
        for input in &node.inputs {
            if let Input::Topic(topic) = input
                && let Some((writer, output)) = written.get(topic)
            {
                problems.push(if *writer == node.name {
                    format!(
                        "stage `{writer}` reads topic `{topic}`, which its output `{output}` writes: a stage cannot read itself"
                    )
                } else {
                    let read = if *output == DEFAULT_OUTPUT {
                        format!("{{ stage = \"{writer}\" }}")
                    } else {
                        format!("{{ stage = \"{writer}\", output = \"{output}\" }}")
                    };
                    format!(
                        "stage `{}` reads topic `{topic}`, which stage `{writer}` writes: read {read} instead (an edge Weir knows), or write another topic",
                        node.name
                    )
                });
            }
        }
    }
}

fn invalid_output(stage: &str, output: &str) -> String {
    format!(
        "stage `{stage}`: output names must be 1..={NAME_BYTES_MAX} bytes of [a-z0-9_-]. output=`{output}`"
    )
}

/// Inputs: at least one, each once, each of a known stage's known output, none its own.
fn check_inputs(nodes: &[Node<'_>], index: &BTreeMap<&str, usize>, problems: &mut Vec<String>) {
    for node in nodes {
        if node.inputs.is_empty() {
            problems.push(format!("stage `{}` has no input", node.name));
        }
        let mut seen = BTreeSet::new();
        for input in &node.inputs {
            if !seen.insert(input) {
                problems.push(format!("stage `{}` reads {input} twice", node.name));
            }
            let Input::Stage { stage, output } = input else {
                continue;
            };
            if !index.contains_key(stage) {
                problems.push(format!(
                    "stage `{}` reads stage `{stage}`, which the pipeline does not have",
                    node.name
                ));
            } else if !valid_name(output) {
                problems.push(invalid_output(stage, output));
            }
        }
    }
}

/// The stages in dependency order (Kahn's algorithm, the lowest declared index first); a
/// problem naming the stages of every cycle, which are left out.
fn order(
    nodes: &[Node<'_>],
    index: &BTreeMap<&str, usize>,
    problems: &mut Vec<String>,
) -> Vec<usize> {
    let upstream: Vec<BTreeSet<usize>> = nodes
        .iter()
        .map(|node| {
            node.inputs
                .iter()
                .filter_map(|input| match input {
                    Input::Stage { stage, .. } => index.get(stage).copied(),
                    Input::Topic(_) => None,
                })
                .collect()
        })
        .collect();
    let mut waiting: Vec<usize> = upstream.iter().map(BTreeSet::len).collect();
    let mut ready: BTreeSet<usize> = (0..nodes.len()).filter(|i| waiting[*i] == 0).collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(next) = ready.pop_first() {
        order.push(next);
        for (i, up) in upstream.iter().enumerate() {
            if up.contains(&next) {
                waiting[i] -= 1;
                if waiting[i] == 0 {
                    ready.insert(i);
                }
            }
        }
    }
    if order.len() < nodes.len() {
        let stuck: Vec<&str> = (0..nodes.len())
            .filter(|i| !order.contains(i))
            .map(|i| nodes[i].name)
            .collect();
        problems.push(format!(
            "the stages form a cycle: a stage cannot read itself or a stage that reads it. stages={stuck:?}"
        ));
    }
    order
}

/// Why a pipeline's output bindings do not fit its operator: every problem, joined.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .problems.join("; "))]
pub struct OutputBindingError {
    /// Each problem, naming its output.
    pub problems: Vec<String>,
}

/// The topic of each output of an operator that declared the named outputs `declared`: index
/// 0 is [`DEFAULT_OUTPUT`]'s (`default_topic`; none: the emits go to an Iceberg table alone),
/// index `i + 1` is `declared[i]`'s, from `bound` (output name → topic). The indexes are those
/// of [`crate::runtime::StagedEmit::output`].
///
/// # Errors
/// [`OutputBindingError`] naming each declared output that `bound` leaves out and each
/// binding of a name the operator does not declare (a typo would otherwise drop its records).
pub fn bind_outputs(
    declared: &[String],
    default_topic: Option<&str>,
    bound: &BTreeMap<String, String>,
) -> Result<Vec<Option<String>>, OutputBindingError> {
    let mut problems = Vec::new();
    for name in declared {
        if !bound.contains_key(name) {
            problems.push(format!(
                "the operator's output `{name}` goes nowhere: bind it to a topic or a later stage (a stage's `outputs`, or `[pipeline.outputs]`)"
            ));
        }
    }
    for name in bound.keys() {
        if !declared.contains(name) {
            problems.push(format!(
                "the operator has no output `{name}` (bound by the pipeline, or read by a later stage): it declares {declared:?} besides `{DEFAULT_OUTPUT}`"
            ));
        }
    }
    if !problems.is_empty() {
        return Err(OutputBindingError { problems });
    }
    Ok(std::iter::once(default_topic.map(str::to_owned))
        .chain(declared.iter().map(|name| bound.get(name).cloned()))
        .collect())
}

/// The outputs read by stages and bound to no topic of the user's, in stage order.
fn internal_edges(nodes: &[Node<'_>], index: &BTreeMap<&str, usize>) -> Vec<(usize, String)> {
    let mut edges = BTreeSet::new();
    for input in nodes.iter().flat_map(|n| &n.inputs) {
        if let Input::Stage { stage, output } = input
            && let Some(&i) = index.get(stage)
            && !nodes[i].topics.contains_key(output)
        {
            edges.insert((i, (*output).to_owned()));
        }
    }
    edges.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node<'a>(name: &'a str, inputs: Vec<Input<'a>>, topic: Option<&'a str>) -> Node<'a> {
        Node {
            name,
            inputs,
            topics: topic.map(|t| (DEFAULT_OUTPUT, t)).into_iter().collect(),
        }
    }

    fn stage(name: &str) -> Input<'_> {
        Input::Stage {
            stage: name,
            output: DEFAULT_OUTPUT,
        }
    }

    #[test]
    fn stages_are_ordered_after_what_they_read_and_unbound_edges_are_internal() {
        let nodes = [
            node("top", vec![stage("count")], Some("busiest")),
            node("count", vec![Input::Topic("flights")], None),
            node(
                "audit",
                vec![stage("count"), Input::Topic("other")],
                Some("audit"),
            ),
        ];
        let order = check(&nodes).expect("a valid graph");
        assert_eq!(order.stages, vec![1, 0, 2]);
        assert_eq!(order.internal, vec![(1, DEFAULT_OUTPUT.to_owned())]);
    }

    #[test]
    fn a_one_stage_pipeline_has_no_internal_topic() {
        let nodes = [node("main", vec![Input::Topic("in")], Some("out"))];
        let order = check(&nodes).expect("valid");
        assert_eq!(order.stages, vec![0]);
        assert!(order.internal.is_empty());
    }

    #[test]
    fn every_problem_of_a_graph_is_named_at_once() {
        let nodes = [
            node("a", vec![stage("b")], None),
            node("b", vec![stage("a")], None),
            node("Bad!", vec![], Some("x")),
            node("c", vec![stage("ghost"), Input::Topic("x")], Some("y")),
            node("c", vec![Input::Topic("in")], Some("z")),
            Node {
                name: "d",
                inputs: vec![Input::Stage {
                    stage: "c",
                    output: "late",
                }],
                topics: BTreeMap::from([("Late!", "late-topic"), (DEFAULT_OUTPUT, "d-out")]),
            },
        ];
        let problems = check(&nodes).expect_err("invalid");
        let want = [
            "stages[2].name must be",
            "stage `c` is named twice",
            "stage `c` reads topic `x`, which stage `Bad!` writes",
            "stage `d`: output names must be",
            "stage `Bad!` has no input",
            "stage `c` reads stage `ghost`, which the pipeline does not have",
            "the stages form a cycle",
        ];
        for (problem, want) in problems.iter().zip(want) {
            assert!(problem.contains(want), "{problem:?} should say {want:?}");
        }
        assert_eq!(problems.len(), want.len(), "{problems:#?}");
        assert!(problems[6].contains(r#"["a", "b"]"#), "{}", problems[6]);
    }

    #[test]
    fn two_stages_of_one_name_make_each_problem_once() {
        let nodes = [
            node("a", vec![Input::Topic("in")], None),
            node("a", vec![Input::Topic("in")], None),
        ];
        let problems = check(&nodes).expect_err("invalid");
        assert_eq!(problems.len(), 2, "{problems:#?}");
        assert_eq!(problems[0], "stage `a` is named twice");
        assert!(problems[1].contains("goes nowhere"), "{}", problems[1]);
    }

    #[test]
    fn an_output_read_by_no_stage_and_bound_to_no_topic_goes_nowhere() {
        let nodes = [
            node("first", vec![Input::Topic("in")], None),
            node("second", vec![Input::Topic("in")], Some("out")),
        ];
        let problems = check(&nodes).expect_err("invalid");
        assert_eq!(
            problems,
            vec![
                "the output `default` of stage `first` goes nowhere: bind it to a topic or read it in another stage"
                    .to_owned()
            ]
        );
    }

    #[test]
    fn a_named_output_read_by_a_stage_is_an_internal_edge_of_its_own() {
        let nodes = [
            Node {
                name: "first",
                inputs: vec![Input::Topic("in")],
                topics: BTreeMap::from([("late", "late-topic")]),
            },
            node(
                "second",
                vec![Input::Stage {
                    stage: "first",
                    output: DEFAULT_OUTPUT,
                }],
                Some("out"),
            ),
        ];
        let order = check(&nodes).expect("valid");
        assert_eq!(order.internal, vec![(0, DEFAULT_OUTPUT.to_owned())]);
    }

    /// Each declared output gets its bound topic at its index; every output left unbound and
    /// every binding of an undeclared name is named at once.
    #[test]
    fn outputs_bind_by_declared_index_and_every_mismatch_is_named() {
        let declared = ["late".to_owned(), "audit".to_owned()];
        let bound = BTreeMap::from([
            ("audit".to_owned(), "audit-topic".to_owned()),
            ("late".to_owned(), "late-topic".to_owned()),
        ]);
        let topics = bind_outputs(&declared, Some("out"), &bound).expect("fits");
        let want = [Some("out"), Some("late-topic"), Some("audit-topic")];
        assert_eq!(topics, want.map(|t| t.map(str::to_owned)));
        let wrong = BTreeMap::from([("lat".to_owned(), "late-topic".to_owned())]);
        let err = bind_outputs(&declared, None, &wrong).expect_err("mismatch");
        assert_eq!(err.problems.len(), 3, "{err}");
        assert!(
            err.problems[0].contains("output `late` goes nowhere"),
            "{err}"
        );
        assert!(
            err.problems[1].contains("output `audit` goes nowhere"),
            "{err}"
        );
        assert!(err.problems[2].contains("has no output `lat`"), "{err}");
    }

    /// A stage reading as a topic what a stage writes is told which edge to read instead —
    /// with the output when it is a named one — or, when it writes that topic itself, that a
    /// stage cannot read itself.
    #[test]
    fn a_topic_a_stage_writes_is_read_through_the_edge_named_with_its_output() {
        let nodes = [
            Node {
                name: "first",
                inputs: vec![Input::Topic("in")],
                topics: BTreeMap::from([(DEFAULT_OUTPUT, "mid"), ("late", "late-topic")]),
            },
            node("second", vec![Input::Topic("late-topic")], Some("out")),
            node("third", vec![Input::Topic("own")], Some("own")),
        ];
        let problems = check(&nodes).expect_err("invalid");
        assert_eq!(problems.len(), 2, "{problems:#?}");
        assert!(
            problems[0].contains(r#"read { stage = "first", output = "late" } instead"#),
            "{}",
            problems[0]
        );
        assert!(
            problems[1].contains("which its output `default` writes: a stage cannot read itself"),
            "{}",
            problems[1]
        );
    }

    #[test]
    fn an_output_bound_to_a_topic_and_read_by_a_stage_is_read_from_that_topic() {
        let nodes = [
            node("first", vec![Input::Topic("in")], Some("mid")),
            node("second", vec![stage("first")], Some("out")),
        ];
        let order = check(&nodes).expect("valid");
        assert_eq!(order.stages, vec![0, 1]);
        assert!(order.internal.is_empty(), "{order:?}");
    }
}
