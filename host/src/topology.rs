//! A pipeline as a directed acyclic graph of stages (docs/topologies.md): each stage reads
//! topics or the outputs of earlier stages and writes named outputs, each bound to a topic or
//! read by later stages through an internal topic Weir owns (as Kafka Streams' repartition
//! topics). This module checks a graph's shape — every problem at once — and orders its stages
//! so that each comes after the stages it reads; the settings of `weir run`
//! (`config::stages`) and, later, the API's spec describe their stages to it.
//!
//! Operators of the `weir:operator@0.2.0` world emit to one output, [`DEFAULT_OUTPUT`]; named
//! outputs come with the world that lets an operator emit to one.

use std::collections::{BTreeMap, BTreeSet};

/// The output every operator emits to: its only one in the `weir:operator@0.2.0` world.
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
/// an unknown stage or output; an output other than [`DEFAULT_OUTPUT`]; an output that goes
/// nowhere; a topic both written and read by the pipeline; a cycle.
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

/// Outputs: only [`DEFAULT_OUTPUT`] so far, each bound to a topic or read by a stage; no
/// topic written by one stage and read by another as a topic (that is an edge: read the
/// stage).
fn check_outputs(nodes: &[Node<'_>], problems: &mut Vec<String>) {
    let read: BTreeSet<(&str, &str)> = nodes
        .iter()
        .flat_map(|n| &n.inputs)
        .filter_map(|input| match input {
            Input::Stage { stage, output } => Some((*stage, *output)),
            Input::Topic(_) => None,
        })
        .collect();
    let written: BTreeMap<&str, &str> = nodes
        .iter()
        .flat_map(|n| n.topics.values().map(|topic| (*topic, n.name)))
        .collect();
    for node in nodes {
        for output in node.topics.keys() {
            if *output != DEFAULT_OUTPUT {
                problems.push(unknown_output(node.name, output));
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
                && let Some(writer) = written.get(topic)
            {
                problems.push(format!(
                    "stage `{}` reads topic `{topic}`, which stage `{writer}` writes: read {{ stage = \"{writer}\" }} instead",
                    node.name
                ));
            }
        }
    }
}

fn unknown_output(stage: &str, output: &str) -> String {
    format!(
        "stage `{stage}` has no output `{output}`: operators of weir:operator@0.2.0 emit to `{DEFAULT_OUTPUT}` only"
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
            } else if *output != DEFAULT_OUTPUT {
                problems.push(unknown_output(stage, output));
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
                topics: BTreeMap::from([("late", "late-topic"), (DEFAULT_OUTPUT, "d-out")]),
            },
        ];
        let problems = check(&nodes).expect_err("invalid");
        let want = [
            "stages[2].name must be",
            "stage `c` is named twice",
            "stage `c` reads topic `x`, which stage `Bad!` writes",
            "stage `d` has no output `late`",
            "stage `Bad!` has no input",
            "stage `c` reads stage `ghost`, which the pipeline does not have",
            "stage `c` has no output `late`",
            "the stages form a cycle",
        ];
        for (problem, want) in problems.iter().zip(want) {
            assert!(problem.contains(want), "{problem:?} should say {want:?}");
        }
        assert_eq!(problems.len(), want.len(), "{problems:#?}");
        assert!(problems[7].contains(r#"["a", "b"]"#), "{}", problems[7]);
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
