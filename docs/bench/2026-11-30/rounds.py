# Per-round figures of a bench --compare JSON: overhead p50/p99 and CPU (worker, PostgreSQL, SecantusDB) by side. Usage: python3 rounds.py FILE.json
import json,sys,statistics as st
d=json.load(open(sys.argv[1]))
for side in "ab":
    rs=[r[1] for r in d['rounds'] if r[0]==side]
    p50=[r['overhead_ms']['p50'] for r in rs]; p99=[r['overhead_ms']['p99'] for r in rs]
    w=[r['resources']['worker_cpu_s_per_1000'] for r in rs]; pg=[r['resources']['postgres_cpu_s_per_1000'] for r in rs]
    mg=[r['resources']['mongo_cpu_s_per_1000'] for r in rs]
    print(side, "p50", [round(x,1) for x in p50], "mean", round(st.mean(p50),1), "| p99", [round(x,1) for x in p99], "median", round(st.median(p99),1))
    print("   worker", [round(x,2) for x in w], "pg", [round(x,2) for x in pg], "mongo", [round(x,1) for x in mg])
    split=[r['resources'].get('postgres_cpu') for r in rs]
    if all(split):
        print("   pg backends", [round(x['backends'],2) for x in split], "background", [round(x['background'],2) for x in split], "exited", [round(x['exited'],2) for x in split])
