//! `word-count`: counts words per key (for example per document or per user) in a map state
//! and emits `{"word": w, "count": n}` for every word of every line, with the count so far
//! under that key. Input values are UTF-8 text; words are maximal runs of alphanumeric
//! characters, lower-cased.

use serde::Serialize;
use weir_sdk::{Context, MapState, Operator, Record, Reject, StateSpec};

/// The operator.
#[derive(Debug)]
pub struct WordCount;

const COUNTS: MapState<String, u64> = MapState::new("word-counts");

#[derive(Serialize)]
struct Output<'a> {
    word: &'a str,
    count: u64,
}

impl Operator for WordCount {
    const NAME: &'static str = "word-count";
    const VERSION: &'static str = "0.1.0";
    const STATES: &'static [StateSpec] = &[COUNTS.spec()];

    fn process(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
        let text = std::str::from_utf8(record.value())
            .map_err(|e| Reject::new(format!("value is not UTF-8: {e}")))?;
        for word in text
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
        {
            let word = word.to_lowercase();
            let count = ctx.map_get(&COUNTS, &word)?.unwrap_or(0) + 1;
            ctx.map_put(&COUNTS, &word, &count)?;
            ctx.emit_json(record.key(), &Output { word: &word, count })?;
        }
        Ok(())
    }
}

weir_sdk::export_operator!(WordCount);
