# By thread (the samples' comm) and, for samples that landed in the kernel, the first user-space frame under it. Usage: python3 threads.py SCRIPT
import sys,re,collections
samples=[];cur=None;hdr=None
for line in open(sys.argv[1],errors="replace"):
    line=line.rstrip("\n")
    if not line.strip():
        if cur is not None: samples.append((hdr,cur)); cur=None
        continue
    if not line.startswith((" ","\t")): hdr=line; cur=[]
    elif cur is not None: cur.append(line.strip())
if cur is not None: samples.append((hdr,cur))
n=len(samples)
thr=collections.Counter()
for h,fr in samples: thr[h.split()[0]]+=1
print("by thread comm:", {k:round(100*v/n,1) for k,v in thr.most_common(10)})
c=collections.Counter()
for h,fr in samples:
    if not fr or "kernel" not in fr[0]: continue
    # first non-kernel frame
    for f in fr:
        if "kernel" in f: continue
        m=re.match(r"\S+\s+(.*?)\s+\(",f); c[(m.group(1) if m else f)[:100]]+=1; break
    else: c["<all kernel>"]+=1
tot=sum(c.values()); print("kernel samples",tot, round(100*tot/n,1))
for k,v in c.most_common(10): print(round(100*v/n,2),k)
