"""Opens an Iceberg table the way a user's tool would: pyiceberg's SqlCatalog on the same SQLite
database as Weir's host, files on the S3 server through pyarrow.

`read` prints one JSON object: {"rows": [every row as an object], "snapshots": [{"id",
"summary"}]}. `append ROWS_JSON` commits the rows (a JSON list of objects) as another writer
would, in a snapshot of its own.

Usage: python table.py read|append CATALOG_URI CATALOG_NAME TABLE S3_ENDPOINT [ROWS_JSON]
  e.g. python table.py read sqlite:////tmp/c.db weir t1.routes http://127.0.0.1:9000
"""

import json
import sys

from pyiceberg.catalog.sql import SqlCatalog


def main():
    mode, uri, name, table_name, endpoint = sys.argv[1:6]
    catalog = SqlCatalog(
        name,
        uri=uri,
        **{
            "s3.endpoint": endpoint,
            "s3.access-key-id": "test",
            "s3.secret-access-key": "test",
            "s3.region": "us-east-1",
            "s3.force-virtual-addressing": "false",
        },
    )
    table = catalog.load_table(table_name)
    if mode == "append":
        import pyarrow as pa

        rows = json.loads(sys.argv[6])
        table.append(pa.Table.from_pylist(rows, schema=table.schema().as_arrow()))
        return
    rows = table.scan().to_arrow().to_pylist()
    snapshots = [
        {"id": s.snapshot_id, "summary": dict(s.summary.additional_properties)}
        for s in table.snapshots()
    ]
    json.dump({"rows": rows, "snapshots": snapshots}, sys.stdout, default=str)


if __name__ == "__main__":
    main()
