"""What a round trip costs a PostgreSQL backend: a bare Sync (what sqlx sends for every connection it
takes back into its pool) against a prepared SELECT 1 (Bind, Execute, Sync), N of each, twice, measured
from the backend's own CPU ticks (/proc/<pid>/stat). psycopg (PyPI) logs in; the rest is the protocol by
hand. Usage: python pingcost.py [N], with the local stack up (deploy/local/stack.sh)."""
import psycopg, os, socket, struct, time, sys
N=int(sys.argv[1]) if len(sys.argv)>1 else 20000
conn=psycopg.connect(os.environ.get("POSTGRES_URL", "postgresql://companion:companion@127.0.0.1:5432/companion"), autocommit=True)
pid=conn.execute("select pg_backend_pid()").fetchone()[0]
fd=conn.pgconn.socket
s=socket.socket(fileno=os.dup(fd)); s.setblocking(True)
def ticks():
    f=open(f"/proc/{pid}/stat").read().rsplit(')',1)[1].split()
    return int(f[11])+int(f[12])
def readz():
    buf=b''
    while True:
        while len(buf)<5: buf+=s.recv(65536)
        t=buf[0:1]; l=struct.unpack('!i',buf[1:5])[0]
        while len(buf)<1+l: buf+=s.recv(65536)
        msg=buf[:1+l]; buf=buf[1+l:]
        if t==b'E': raise Exception(msg)
        if t==b'Z': assert not buf; return
def m(t,body): return t+struct.pack('!i',len(body)+4)+body
sync=m(b'S',b'')
# prepare statement s1
s.sendall(m(b'P',b's1\x00SELECT 1\x00\x00\x00')+sync); readz()
bind=m(b'B',b'\x00s1\x00'+b'\x00\x00'+b'\x00\x00'+b'\x00\x00')+m(b'E',b'\x00'+b'\x00\x00\x00\x00')
def run(name,payload):
    t0=ticks(); w=time.time()
    for _ in range(N):
        s.sendall(payload); readz()
    dt=ticks()-t0; tick=os.sysconf('SC_CLK_TCK')
    print(f"{name}: {N} round trips, backend CPU {dt/tick:.2f} s = {dt/tick/N*1e6:.1f} us each, wall {(time.time()-w)/N*1e6:.1f} us")
for r in range(2):
    run("sync only (sqlx ping)", sync)
    run("bind+execute+sync SELECT 1 (prepared)", bind+sync)
