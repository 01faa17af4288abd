# Web search flow sizes (DCTCP): Alizadeh et al., "Data Center TCP (DCTCP)", SIGCOMM 2010;
# as shipped by HPCC: Li et al., "HPCC: High Precision Congestion Control", SIGCOMM 2019.
# From github.com/alibaba-edu/High-Precision-Congestion-Control,
# traffic_gen/WebSearch_distribution.txt at commit 9cf8b9e8c8d04a3775e06c972c4699dcbce53c37.
# Format: <flow size in bytes> <cumulative percent>, one point a line.
0 0
10000 15
20000 20
30000 30
50000 40
80000 53
200000 60
1000000 70
2000000 80
5000000 90
10000000 97
30000000 100
