"""Apache Flink running one of sluice's example operators' jobs over the JSONL file
`sluice run` reads.

    python job.py vehicle-stats|vehicle-stats-udf|speed-windows hashmap|rocksdb POSITIONS.jsonl

What it measures: one Flink job (PyFlink 2.3 Table API, SQL, local mini-cluster in the
gateway JVM, parallelism 1, streaming mode) reading the file with the filesystem
connector and the json format, its state in the backend named (`hashmap`: objects on the
JVM heap; `rocksdb`: embedded RocksDB), checkpointing every 10 s to a scratch directory,
its rows into a `blackhole` sink. The jobs:

- `vehicle-stats`: per vehicle_id the running count, mean and max speed, first/last seen
  and last position, each vehicle's updated row emitted per record. Like for like with
  vehicle-stats: one record at a time through a keyed aggregate, an update out per record
  (streaming mode without mini-batch: a group aggregate emits the new row for every
  input). What is not: vehicle-stats also sums the haversine distance (see the query).
- `vehicle-stats-udf`: vehicle-stats' whole aggregate, the haversine distance included,
  as a Python user-defined aggregate function (`VehicleStats` below) in the same group
  aggregate: Flink runs it in Python worker processes beside the JVM (Apache Beam's
  runner), as a PyFlink user writing the logic in Python would. Like for like with
  vehicle-stats written in Python (`operators/vehicle-stats-py`).
- `speed-windows`: per vehicle_id the count, mean and max speed of each minute (`TUMBLE`)
  and of the last 5 minutes every minute (`HOP`), window table-valued functions over the
  event time `ts` with a watermark at it (no lateness: speed-windows' grace is 0), each
  window's row emitted once when it closes, as speed-windows emits it. Flink's window
  aggregation slices hopping windows and keeps timers in its own timer service.

Both: vehicle-stats and speed-windows serialize their outputs as JSON and write them to a
file; here the rows are dropped by the sink without being serialized. It prints one line:

    flink <job> <backend> records=N wall_s=X records_per_s=Y cpu_s=Z peak_rss_mib=M setup_s=S

What each figure counts:
- wall_s: from execute_insert() returning (the query planned, the mini-cluster started,
  the job submitted) to wait() returning (the job finished). `sluice run`'s "processed in"
  likewise starts after its operator is compiled and its state opened; setup_s is the
  planning and mini-cluster start-up left out (the JVM's own start comes before both).
- records_per_s: records / wall_s; records are the file's lines (the json format fails
  the job on a line it cannot parse, so every line is processed).
- cpu_s: CPU time (user + system, every thread) over that same interval, of this Python
  process and every process under it: the gateway JVM, which runs the whole job, and the
  Python workers it starts for a user-defined function (read from /proc/<pid>/stat every
  0.2 s while each is alive: one that exits between two reads loses at most that much).
  Not RUSAGE_CHILDREN: that counts only children already exited and waited for, and
  PyFlink's gateway JVM outlives the last line printed.
- peak_rss_mib: the largest VmHWM (/proc/<pid>/status, its peak resident memory over its
  life, as `sluice run` reports its own) of the processes under this one, read after the
  job finished. The JVM runs with its default heap limit (a quarter of the machine's memory).
"""
import math
import os
import resource
import shutil
import sys
import tempfile
import threading
import time

from pyflink.common import Configuration, Row
from pyflink.table import AggregateFunction, DataTypes, EnvironmentSettings, TableEnvironment
from pyflink.table.udf import udaf

TICK = os.sysconf("SC_CLK_TCK")


def descendants(pid):
    """The processes under `pid`, found through their parent in /proc/<pid>/stat."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            parents[int(entry)] = int(stat[stat.rfind(")") + 2:].split()[1])
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        children = [p for p, pp in parents.items() if pp == parent]
        found += children
        todo += children
    return found


def own_cpu_seconds():
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


class CpuOfDescendants(threading.Thread):
    """The user + system CPU (utime and stime: fields 14, 15 of /proc/<pid>/stat) each
    process under this one had used when last read, read every 0.2 s."""

    def __init__(self):
        super().__init__(daemon=True)
        self.seen, self.done = {}, threading.Event()

    def read(self):
        for pid in descendants(os.getpid()):
            try:
                fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            self.seen[pid] = (int(fields[11]) + int(fields[12])) / TICK

    def run(self):
        while not self.done.wait(0.2):
            self.read()

    def total(self):
        self.read()
        return sum(self.seen.values())


def peak_rss_mib(pid):
    """VmHWM of `pid`; 0 for a process gone since it was listed (a Python worker ending)."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class VehicleStats(AggregateFunction):
    """vehicle-stats' summary in Python, as `operators/vehicle-stats-py` folds it: count,
    mean and max speed, haversine distance, first/last seen and last position. The
    accumulator is a Row of those, in that order."""

    def create_accumulator(self):
        return Row(0, 0.0, 0.0, 0.0, 0, 0, 0.0, 0.0)

    def accumulate(self, acc, ts, lat, lon, speed):
        if acc[0] == 0:
            acc[4], acc[5] = ts, ts
        else:
            acc[3] += haversine_km(acc[6], acc[7], lat, lon)
        acc[0] += 1
        acc[1] += (speed - acc[1]) / acc[0]
        acc[2] = max(acc[2], speed)
        acc[4], acc[5] = min(acc[4], ts), max(acc[5], ts)
        acc[6], acc[7] = lat, lon

    def get_value(self, acc):
        return Row(*acc)

    def get_accumulator_type(self):
        return SUMMARY_TYPE

    def get_result_type(self):
        return SUMMARY_TYPE


SUMMARY_TYPE = DataTypes.ROW([
    DataTypes.FIELD(name, kind) for name, kind in [
        ("count", DataTypes.BIGINT()), ("mean_speed_kmh", DataTypes.DOUBLE()),
        ("max_speed_kmh", DataTypes.DOUBLE()), ("distance_km", DataTypes.DOUBLE()),
        ("first_seen", DataTypes.BIGINT()), ("last_seen", DataTypes.BIGINT()),
        ("last_lat", DataTypes.DOUBLE()), ("last_lon", DataTypes.DOUBLE())]])


def haversine_km(lat1, lon1, lat2, lon2):
    dlat, dlon = math.radians(lat2 - lat1), math.radians(lon2 - lon1)
    half_lat, half_lon = math.sin(dlat / 2.0), math.sin(dlon / 2.0)
    a = half_lat * half_lat + math.cos(math.radians(lat1)) * math.cos(math.radians(lat2)) * (half_lon * half_lon)
    return 6371.0088 * 2.0 * math.asin(math.sqrt(a))


# Each job: what its source has besides the file's fields, its sink's columns, and its
# query from `positions` into `sink`.
JOBS = {
    # vehicle-stats' summary but the distance: summing haversine(previous position, this
    # one) needs the previous row's position inside the aggregate, which takes a
    # user-defined aggregate function (Java, or Python in a separate worker process)
    # rather than SQL's built-ins, so it is the one aggregate left out. LAST_VALUE takes
    # the last row in arrival order, as vehicle-stats' last_lat/last_lon do.
    "vehicle-stats": ("", """
        vehicle_id STRING, cnt BIGINT, mean_speed_kmh DOUBLE, max_speed_kmh DOUBLE,
        first_seen BIGINT, last_seen BIGINT, last_lat DOUBLE, last_lon DOUBLE""", """
        INSERT INTO sink
        SELECT vehicle_id, COUNT(*), AVG(speed_kmh), MAX(speed_kmh), MIN(ts), MAX(ts),
               LAST_VALUE(lat), LAST_VALUE(lon)
        FROM positions GROUP BY vehicle_id"""),
    # Sending the summary as one column: the sink drops it unserialized, as it does the
    # SQL job's columns.
    "vehicle-stats-udf": ("", """
        vehicle_id STRING, summary ROW<`count` BIGINT, mean_speed_kmh DOUBLE, max_speed_kmh DOUBLE,
        distance_km DOUBLE, first_seen BIGINT, last_seen BIGINT, last_lat DOUBLE, last_lon DOUBLE>""", """
        INSERT INTO sink
        SELECT vehicle_id, vehicle_stats(ts, lat, lon, speed_kmh) FROM positions GROUP BY vehicle_id"""),
    # speed-windows' two window specs, one source read feeding both, on the event time
    # with its watermark at it.
    "speed-windows": (""",
        event_time AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR event_time AS event_time""", """
        vehicle_id STRING, window_name STRING, window_start TIMESTAMP(3), window_end TIMESTAMP(3),
        positions BIGINT, mean_speed_kmh DOUBLE, max_speed_kmh DOUBLE""", """
        INSERT INTO sink
        SELECT vehicle_id, 'minute', window_start, window_end, COUNT(*), AVG(speed_kmh), MAX(speed_kmh)
        FROM TABLE(TUMBLE(TABLE positions, DESCRIPTOR(event_time), INTERVAL '1' MINUTE))
        GROUP BY vehicle_id, window_start, window_end
        UNION ALL
        SELECT vehicle_id, '5min', window_start, window_end, COUNT(*), AVG(speed_kmh), MAX(speed_kmh)
        FROM TABLE(HOP(TABLE positions, DESCRIPTOR(event_time), INTERVAL '1' MINUTE, INTERVAL '5' MINUTE))
        GROUP BY vehicle_id, window_start, window_end"""),
}


def main():
    job, backend, path = sys.argv[1], sys.argv[2], os.path.abspath(sys.argv[3])
    assert job in JOBS, f"job: one of {', '.join(JOBS)}"
    assert backend in ("hashmap", "rocksdb"), "state backend: hashmap or rocksdb"
    event_time, columns, query = JOBS[job]
    with open(path, "rb") as f:
        records = sum(1 for _ in f)
    scratch = tempfile.mkdtemp(prefix="flink-bench-")

    config = Configuration()
    for key, value in {
        "parallelism.default": "1",
        # Windows of event time aligned to the epoch, as sluice's are.
        "table.local-time-zone": "UTC",
        "state.backend.type": backend,
        "state.backend.rocksdb.localdir": f"{scratch}/rocksdb",
        "execution.checkpointing.interval": "10s",
        "execution.checkpointing.storage": "filesystem",
        "execution.checkpointing.dir": f"file://{scratch}/checkpoints",
        # Off: with it on, a finished bounded source waits for the next checkpoint (up to
        # 10 s idle) before the job may end; `sluice run` ends with a commit, not a wait.
        "execution.checkpointing.checkpoints-after-tasks-finish": "false",
        # Python functions run in workers of this interpreter (the virtual environment's).
        "python.executable": sys.executable,
        "python.client.executable": sys.executable,
    }.items():
        config.set_string(key, value)
    settings = (EnvironmentSettings.new_instance().in_streaming_mode()
                .with_configuration(config).build())
    t_env = TableEnvironment.create(settings)  # starts the gateway JVM
    t_env.create_temporary_function("vehicle_stats", udaf(VehicleStats()))
    cpu_of = CpuOfDescendants()
    cpu_of.start()

    t_env.execute_sql(f"""
        CREATE TABLE positions (
            vehicle_id STRING, ts BIGINT, lat DOUBLE, lon DOUBLE, speed_kmh DOUBLE{event_time}
        ) WITH ('connector' = 'filesystem', 'path' = 'file://{path}', 'format' = 'json')""")
    t_env.execute_sql(f"CREATE TABLE sink ({columns}) WITH ('connector' = 'blackhole')")
    started = time.monotonic()
    result = t_env.execute_sql(query)
    submitted, cpu_before = time.monotonic(), own_cpu_seconds() + cpu_of.total()
    result.wait()
    wall = time.monotonic() - submitted
    cpu = own_cpu_seconds() + cpu_of.total() - cpu_before
    cpu_of.done.set()
    peak = max(peak_rss_mib(pid) for pid in descendants(os.getpid()))
    print(f"flink {job} {backend} records={records} wall_s={wall:.2f} records_per_s={records / wall:.0f} "
          f"cpu_s={cpu:.2f} peak_rss_mib={peak:.0f} setup_s={submitted - started:.2f}", flush=True)
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
