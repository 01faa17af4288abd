# Alibaba storage flow sizes, 2019, as shipped by the HPCC repository (Li et al., SIGCOMM 2019).
# From github.com/alibaba-edu/High-Precision-Congestion-Control,
# traffic_gen/AliStorage2019.txt at commit fe18e47f4cded502eb5f9c99e4a4941645ab889b.
# Format: <flow size in bytes> <cumulative percent>, one point a line.
0 0
4000 22.93
8000 69.21
16000 80.61
32000 90.47
64000 93.53
128000 96.77
256000 97.53
2000000 100
