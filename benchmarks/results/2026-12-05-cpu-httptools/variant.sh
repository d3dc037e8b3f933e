#!/bin/bash
# $1 http $2 loop $3 tag
HTTP_IMPL=$1 LOOP_IMPL=$2 .venv/bin/python launch.py > v_$3.log 2>&1 &
SP=$!
for i in $(seq 1 60); do curl -sf localhost:8790/health >/dev/null && break; sleep 0.5; done
# warm
.venv/bin/python benchmarks/delivery_cpu.py --url http://127.0.0.1:8790 --procs 2 --rate 10 --requests 20 --prompt 16,32 --new 32,64 > /dev/null 2>&1
PID=$(pgrep -f "launch.py" | head -1)
c0=$(awk '{print $14+$15}' /proc/$PID/stat)
.venv/bin/python benchmarks/delivery_cpu.py --url http://127.0.0.1:8790 --procs 2 --rate 30 --requests 160 --prompt 16,32 --new 64,128 --json v_$3.json > /dev/null 2>&1
c1=$(awk '{print $14+$15}' /proc/$PID/stat)
python3 -c "
import json; d=json.load(open('v_$3.json')); ticks=$c1-$c0
print('$3', 'server cpu s %.2f' % (ticks/100), 'chunks', d['client_chunks'], 'us/chunk %.0f' % (ticks/100/d['client_chunks']*1e6), 'itl', d['client_itl_ms'], 'delay', d['delivery_delay_ms'], 'gap', d['engine_token_gap_ms']['p50'])"
kill $SP; wait $SP 2>/dev/null
