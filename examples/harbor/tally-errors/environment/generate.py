"""Write `count` records as `id,status` lines (the same ones every time)."""

import sys

count = int(sys.argv[1])
for number in range(1, count + 1):
    status = "error" if number % 7 == 3 or number % 11 == 0 else "ok"
    print(f"{number},{status}")
