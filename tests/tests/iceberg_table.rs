//! The Iceberg sink's table path on the real S3 server and a SQLite catalog, read back and
//! written to by `pyiceberg` (another tool, as a user's): data files written per shard and
//! checkpoint, committed exactly once across commits, another writer's snapshot in between,
//! and the table seen the same by both.

use serde_json::{Value, json};
use std::collections::BTreeMap;
use weir_host::ids::Partition;
use weir_host::sink::iceberg::commit::{self, PendingCheckpoint};
use weir_host::sink::iceberg::files::{decode_data_file, encode_data_file};
use weir_host::sink::iceberg::{
    ColumnSpec, ColumnType, Lakehouse, LakehouseSettings, ShardFiles, TableSchema,
};
use weir_tests::iceberg::{pyiceberg, read_with_pyiceberg};
use weir_tests::{create_s3_bucket, s3_endpoint, s3_options};

const UID: &str = "pipe-7f3a";

fn schema() -> TableSchema {
    let column = |name: &str, kind, required| ColumnSpec {
        name: name.into(),
        kind,
        required,
    };
    TableSchema::new(&[
        column("route", ColumnType::String, true),
        column("flights", ColumnType::Long, true),
        column("delay_mean", ColumnType::Double, false),
    ])
    .expect("a valid schema")
}

/// One checkpoint's files of `partition` with `route`'s rows `flights`, through their JSON
/// form (as a shard's pending list carries them).
async fn checkpoint(
    lakehouse: &Lakehouse,
    partition: i32,
    version: u64,
    route: &str,
    flights: std::ops::RangeInclusive<i64>,
) -> anyhow::Result<PendingCheckpoint> {
    let table = lakehouse.table("t1", "routes", &schema()).await?;
    let mut files = ShardFiles::new(
        &table,
        schema(),
        format!("weir-{UID}-{partition}-{version}"),
        64 << 10,
    )?;
    for n in flights {
        let mean = (n % 3 != 0).then_some(n as f64 / 2.0);
        let row = json!({"route": route, "flights": n, "delay_mean": mean});
        files.push(row.to_string().as_bytes()).await?;
    }
    let schema = table.metadata().current_schema().clone();
    let files = files
        .close()
        .await?
        .into_iter()
        .map(|f| decode_data_file(&encode_data_file(f)?, &schema))
        .collect::<Result<_, _>>()?;
    Ok(PendingCheckpoint {
        partition: Partition(partition),
        version: weir_host::ids::ManifestVersion(version),
        files,
        covered: Default::default(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_on_s3_committed_exactly_once_reads_back_in_pyiceberg_around_another_writer()
-> anyhow::Result<()> {
    let bucket = create_s3_bucket().await?;
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("catalog.db");
    let settings = LakehouseSettings {
        catalog_uri: Some(format!("sqlite://{}?mode=rwc", db.display())),
        warehouse: Some(format!("s3://{bucket}/warehouse")),
        options: s3_options(),
        ..LakehouseSettings::default()
    };
    let lakehouse = Lakehouse::open(&settings).await?;
    let ident = Lakehouse::ident("t1", "routes");
    let commit = |pending: Vec<PendingCheckpoint>, look: bool| {
        let catalog = lakehouse.catalog().clone();
        let ident = ident.clone();
        async move { commit::commit(&catalog, &ident, UID, &pending, look).await }
    };
    // 20,000 rows in files of about 64 KiB: several files per checkpoint.
    let a3 = checkpoint(&lakehouse, 0, 3, "JFK-LAX", 1..=20_000).await?;
    assert!(
        a3.files.len() > 1,
        "the writer rolls files at the target size"
    );
    let b5 = checkpoint(&lakehouse, 1, 5, "EWR-SFO", 1..=100).await?;
    let first = commit(vec![a3.clone(), b5.clone()], true).await?;
    assert_eq!(first.rows, 20_100);

    let catalog_uri = format!("sqlite:///{}", db.display());
    let endpoint = s3_endpoint();
    let py = |mode: &str, extra: Option<&str>| {
        let mut args = vec![mode, &catalog_uri, "weir", "t1.routes", &endpoint];
        args.extend(extra);
        pyiceberg(&args)
    };
    // Another writer commits between our commits.
    py(
        "append",
        Some(r#"[{"route":"OTHER","flights":1,"delay_mean":null}]"#),
    )?;
    // The shards still list checkpoints 3 and 5 (they have not seen the commit), with new ones.
    let a4 = checkpoint(&lakehouse, 0, 4, "JFK-LAX", 20_001..=20_010).await?;
    let b6 = checkpoint(&lakehouse, 1, 6, "EWR-SFO", 101..=120).await?;
    let second = commit(vec![a3, b5, a4, b6], false).await?;
    assert_eq!((second.rows, second.skipped), (30, 2));
    assert_eq!(
        second.committed,
        BTreeMap::from([(Partition(0), 4.into()), (Partition(1), 6.into())])
    );

    let read = read_with_pyiceberg(&db, "t1.routes")?;
    let mut rows: Vec<(String, i64)> = read["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            (
                r["route"].as_str().expect("route").to_owned(),
                r["flights"].as_i64().expect("flights"),
            )
        })
        .collect();
    rows.sort();
    let mut want: Vec<(String, i64)> = (1..=20_010)
        .map(|n| ("JFK-LAX".to_owned(), n))
        .chain((1..=120).map(|n| ("EWR-SFO".to_owned(), n)))
        .chain([("OTHER".to_owned(), 1)])
        .collect();
    want.sort();
    assert_eq!(rows, want, "every row once, the other writer's too");
    let nulls = read["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .filter(|r| r["route"] == "JFK-LAX" && r["delay_mean"].is_null())
        .count();
    assert_eq!(nulls, 20_010 / 3);
    let ours: Vec<&Value> = read["snapshots"]
        .as_array()
        .expect("snapshots")
        .iter()
        .filter(|s| s["summary"]["weir.pipeline-id"] == UID)
        .collect();
    let mut shards: Vec<(String, String)> = ours
        .iter()
        .map(|s| {
            let of = |k: &str| s["summary"][k].as_str().unwrap_or_default().to_owned();
            (of("weir.shard.0"), of("weir.shard.1"))
        })
        .collect();
    shards.sort();
    assert_eq!(
        shards,
        [("3".into(), "5".into()), ("4".into(), "6".into())],
        "one snapshot per commit, each naming its shards' highest checkpoints"
    );
    Ok(())
}
