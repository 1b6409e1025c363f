# Folds `perf script -F comm,tid,ip,sym,dso` output: inclusive shares by crate, top self frames. Usage: python3 fold.py SCRIPT [N]
import sys, re, collections
cats = [("tracing", re.compile(r"tracing")), ("serde_json", re.compile(r"serde_json")),
        ("sqlx", re.compile(r"sqlx")), ("mongodb/bson", re.compile(r"mongodb|bson")),
        ("async_nats", re.compile(r"async_nats")), ("hyper/reqwest", re.compile(r"hyper|reqwest|h2::")),
        ("tokenizers", re.compile(r"tokenizers")), ("ort", re.compile(r"\bort::")),
        ("malloc/free", re.compile(r"\b(malloc|free|realloc|cfree|_int_malloc|_int_free|calloc)\b")),
        ("memcpy", re.compile(r"memcpy|memmove")),
        ("rustls", re.compile(r"rustls")), ("regex", re.compile(r"regex|aho_corasick")),
        ("embed(companion_knowledge)", re.compile(r"companion_knowledge")),
        ("safety", re.compile(r"companion_safety")),
        ("chrono", re.compile(r"chrono")),
        ]
samples=[]; cur=None
for line in open(sys.argv[1], errors="replace"):
    line=line.rstrip("\n")
    if not line.strip():
        if cur: samples.append(cur); cur=None
        continue
    if not line.startswith((" ","\t")):
        cur={"hdr":line,"frames":[]}
    else:
        if cur is not None: cur["frames"].append(line.strip())
if cur: samples.append(cur)
n=len(samples); print("samples",n)
inc=collections.Counter(); selfc=collections.Counter(); selfdso=collections.Counter()
for s in samples:
    fr=s["frames"]
    if not fr: continue
    top=fr[0]
    m=re.match(r"\S+\s+(.*)\s+\((.*)\)$", top)
    sym,dso=(m.group(1),m.group(2)) if m else (top,"?")
    selfc[(sym[:110],dso.split("/")[-1])]+=1
    seen=set()
    for f in fr:
        for name,rx in cats:
            if name not in seen and rx.search(f): seen.add(name)
    for c in seen: inc[c]+=1
print("inclusive:")
for c,v in inc.most_common(): print(f"  {c:28s} {100*v/n:5.1f}%")
print("top self:")
for (sym,dso),v in selfc.most_common(int(sys.argv[2]) if len(sys.argv)>2 else 40): print(f"  {100*v/n:5.2f}% {dso[:20]:20s} {sym}")
