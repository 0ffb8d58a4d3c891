"""Code debugging: buggy snippets asked about in many ways, built combinatorially for drafter training.

Debugging is the arena-hard-style workload's weakest category for the drafter, and half of its
held-out debugging questions show a piece of code. ``worked_problems`` asks about 55 buggy
snippets in five ways from three frames, and every stage since it was added has trained on
nearly all of them. This source adds snippets of its own, in the same eleven languages and
more kinds of bug (boundaries, aliasing, async and concurrency mistakes, swallowed errors,
dates and encodings, SQL semantics, shell quoting, ...), each asked in more ways: the five asks
of ``worked_problems`` and six more, from its three frames and four more. Everything here was
written for this project: nothing is taken from arena-hard-auto or any data set, nor from the
packaged ``arena_hard`` questions, and no snippet repeats one of ``worked_problems``' (tested).
Each snippet has one planted bug and the symptom it causes, checked by running the code where
a compiler or interpreter was at hand.

Ids are ``code_debugging/<snippet>/<ask>/<frame>``, built from keys, so ids and the train/eval
split (the id hash of every source) never change when a list grows; the wording around the
parts varies by id (:func:`workloads.base.pick_by_id`). A separate source rather than more
``worked_problems`` snippets, so that the data runs recorded in a drafter's lineage still replay
exactly. Use: drafter training (``split=train``); the ``eval`` split measures held-out loss,
and the benchmark's arena-hard-style workload stays ``arena_hard``.
"""

from __future__ import annotations

from itertools import product

from .base import Prompt, Workload, refuse_path, user_turn_prompt
from .worked_problems import DEBUG_ASKS, DEBUG_FRAMES, DEBUG_TEMPLATES, Snippet, snippet, snippet_prompt

NAME = "code_debugging"

SNIPPETS: dict[str, Snippet] = {
    # Python
    "py_csv_header_not_skipped": snippet("Python", "should add up quantity times price over orders.csv, but "
                                                   "it fails with \"ValueError: invalid literal for int() "
                                                   "with base 10: 'qty'\"", """
        import csv

        def total_revenue(path):
            total = 0.0
            with open(path, newline="") as f:
                for sku, qty, price in csv.reader(f):
                    total += int(qty) * float(price)
            return total

        print(total_revenue("orders.csv"))
        """),
    "py_json_int_keys": snippet("Python", "should reload the stock levels it saved, but the last line fails "
                                          "with \"KeyError: 1001\" although the file contains the entry", """
        import json

        def save_stock(path, stock):
            with open(path, "w") as f:
                json.dump(stock, f)

        def load_stock(path):
            with open(path) as f:
                return json.load(f)

        stock = {1001: 5, 1002: 0}
        save_stock("stock.json", stock)
        print(load_stock("stock.json")[1001])
        """),
    "py_write_not_flushed": snippet("Python", "should save the shopping list and report how many lines were "
                                              "written, but save_list(\"list.txt\", [\"milk\", \"eggs\", "
                                              "\"bread\"]) returns 0 instead of 3", """
        def save_list(path, items):
            f = open(path, "w", encoding="utf-8")
            for item in items:
                f.write(item.strip() + "\\n")
            with open(path, encoding="utf-8") as check:
                return sum(1 for _ in check)

        print(save_list("list.txt", ["milk", "eggs", "bread"]))
        """),
    "py_csv_header_spaces": snippet("Python", "should list the SKUs that are running low, but on a file whose "
                                              "header line is \"sku, qty\" it fails with \"KeyError: 'qty'\"", """
        import csv

        def low_stock(path, threshold=5):
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                return [row["sku"] for row in reader if int(row["qty"]) < threshold]

        print(low_stock("stock.csv"))
        """),
    "py_json_load_string": snippet("Python", "should pull the event name and object id out of a webhook body, "
                                             "but it fails with \"AttributeError: 'str' object has no "
                                             "attribute 'read'\"", """
        import json

        def parse_webhook(body):
            payload = json.load(body)
            event = payload["event"]
            object_id = payload["data"]["id"]
            return event, object_id

        body = '{"event": "invoice.paid", "data": {"id": 42}}'
        print(parse_webhook(body))
        """),
    "py_bytes_startswith_str": snippet("Python", "should count the ERROR lines in a log file, but it fails "
                                                 "with \"TypeError: startswith first arg must be bytes or a "
                                                 "tuple of bytes, not str\"", """
        def count_errors(path):
            count = 0
            with open(path, "rb") as f:
                for line in f:
                    if line.startswith("ERROR"):
                        count += 1
            return count

        print(count_errors("server.log"))
        """),
    "py_finally_return_swallows": snippet("Python", "should report whether the export worked, but export_rows "
                                                    "returns True without any error when a row contains a "
                                                    "number, and the CSV file is left half-written", """
        def export_rows(path, rows):
            try:
                with open(path, "w", encoding="utf-8") as f:
                    f.write("name,city,visits\\n")
                    for row in rows:
                        f.write(",".join(row) + "\\n")
            finally:
                return True

        ok = export_rows("visits.csv", [("Ana", "Lyon", "4"), ("Ben", "Oslo", 7)])
        print("exported" if ok else "export failed")
        """),
    "py_generator_closed_file": snippet("Python", "should print the highest temperature in temps.txt, but it "
                                                  "fails with \"ValueError: I/O operation on closed file.\"", """
        def read_temperatures(path):
            with open(path) as f:
                return (float(line) for line in f if line.strip())

        temps = read_temperatures("temps.txt")
        print(max(temps))
        """),
    "py_regex_greedy_brackets": snippet("Python", "should return each bracketed field of a log line, but for "
                                                  "\"[2024-05-01 12:00] [WARN] [billing] retry scheduled\" it "
                                                  "returns ['2024-05-01 12:00] [WARN] [billing'] instead of "
                                                  "three fields", """
        import re

        def bracket_fields(line):
            return re.findall(r"\\[(.*)\\]", line)

        line = "[2024-05-01 12:00] [WARN] [billing] retry scheduled"
        print(bracket_fields(line))
        """),
    "py_regex_match_not_search": snippet("Python", "should find the order number in an email subject, but "
                                                   "order_from_subject(\"Re: Order #A1234 shipped\") returns "
                                                   "None while \"#A1234 shipped\" works", """
        import re

        ORDER_ID = re.compile(r"#([A-Z]\\d{4})")

        def order_from_subject(subject):
            m = ORDER_ID.match(subject)
            return m.group(1) if m else None

        print(order_from_subject("#A1234 shipped"))
        print(order_from_subject("Re: Order #A1234 shipped"))
        """),
    "py_rstrip_extension": snippet("Python", "should drop the \".txt\" extension from file names, but it "
                                             "prints \"notes\", \"draf\" and \"budge\" instead of \"notes\", "
                                             "\"draft\" and \"budget\"", """
        def base_name(filename):
            return filename.rstrip(".txt")

        for name in ["notes.txt", "draft.txt", "budget.txt"]:
            print(base_name(name))
        """),
    "py_utf8_truncate_split_char": snippet("Python", "should cut a message preview to at most 20 bytes of "
                                                     "UTF-8, but preview(\"Today's special: crème brûlée\") "
                                                     "fails with \"UnicodeDecodeError: 'utf-8' codec can't "
                                                     "decode byte 0xc3 in position 19: unexpected end of "
                                                     "data\"", """
        def preview(text, max_bytes=20):
            data = text.encode("utf-8")
            if len(data) <= max_bytes:
                return text
            return data[:max_bytes].decode("utf-8") + "..."

        print(preview("Table for two"))
        print(preview("Today's special: crème brûlée"))
        """),
    "py_strftime_minute_for_month": snippet("Python", "should name the archive after the day it was made, but "
                                                      "for 5 March 2024 at 14:37 it prints "
                                                      "\"logs-2024-37-05.tar.gz\" instead of "
                                                      "\"logs-2024-03-05.tar.gz\"", """
        from datetime import datetime

        def archive_name(prefix, when):
            return f"{prefix}-{when:%Y-%M-%d}.tar.gz"

        print(archive_name("logs", datetime(2024, 3, 5, 14, 37)))
        """),
    "py_timedelta_seconds": snippet("Python", "should report how many hours a batch job ran, but a job from 1 "
                                              "June 08:00 to 3 June 09:30 is reported as 1.5 hours instead of "
                                              "49.5", """
        from datetime import datetime

        def job_hours(started, finished):
            return (finished - started).seconds / 3600

        start = datetime(2024, 6, 1, 8, 0)
        end = datetime(2024, 6, 3, 9, 30)
        print(f"job ran for {job_hours(start, end)} hours")
        """),
    "py_weekday_numbering": snippet("Python", "should skip weekends when picking the next business day, but "
                                              "for Friday 2024-06-07 it returns Saturday 2024-06-08 instead "
                                              "of Monday 2024-06-10", """
        from datetime import date, timedelta

        def is_weekend(day):
            return day.weekday() in (6, 7)

        def next_business_day(day):
            day += timedelta(days=1)
            while is_weekend(day):
                day += timedelta(days=1)
            return day

        print(next_business_day(date(2024, 6, 7)))
        """),
    "py_replace_tzinfo": snippet("Python", "should show a 15:00 UTC meeting in Berlin time, but it prints "
                                           "2024-07-01 15:00:00+02:00 instead of 2024-07-01 17:00:00+02:00", """
        from datetime import datetime
        from zoneinfo import ZoneInfo

        def local_time(utc_iso, tz_name):
            moment = datetime.fromisoformat(utc_iso)
            return moment.replace(tzinfo=ZoneInfo(tz_name))

        print(local_time("2024-07-01T15:00:00+00:00", "Europe/Berlin"))
        """),
    "py_next_month_december": snippet("Python", "should move a subscription's billing date on by one month, "
                                                "but for any date in December it fails with \"ValueError: "
                                                "month must be in 1..12\"", """
        from datetime import date

        def next_billing_date(current):
            day = min(current.day, 28)
            return current.replace(month=current.month + 1, day=day)

        print(next_billing_date(date(2024, 10, 31)))
        print(next_billing_date(date(2024, 12, 15)))
        """),
    "py_threads_not_joined": snippet("Python", "should print the order total of each region, fetched in "
                                               "parallel, but it prints {} instead of {'north': 200.5, "
                                               "'south': 42.0}", """
        import threading
        import time

        def fetch_orders(region):
            time.sleep(0.2)  # stands in for a database query
            return [120.0, 80.5] if region == "north" else [42.0]

        def load_region(region, totals):
            totals[region] = sum(fetch_orders(region))

        def regional_totals(regions):
            totals = {}
            for region in regions:
                threading.Thread(target=load_region, args=(region, totals)).start()
            return totals

        print(regional_totals(["north", "south"]))
        """),
    "py_thread_target_called": snippet("Python", "should send the reminders in parallel, but three reminders "
                                                 "take about 3 seconds instead of 1 and are sent strictly one "
                                                 "after another", """
        import threading
        import time

        def send_reminder(email):
            time.sleep(1)  # stands in for an SMTP round trip
            print("sent to", email)

        def send_all(emails):
            threads = [threading.Thread(target=send_reminder(e)) for e in emails]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        start = time.perf_counter()
        send_all(["ana@example.com", "ben@example.com", "cy@example.com"])
        print(f"took {time.perf_counter() - start:.1f}s")
        """),
    "py_executor_errors_lost": snippet("Python", "should upload every file and stop with an error if one "
                                                 "fails, but when one of three files is empty it still prints "
                                                 "\"uploaded 3 files\" and no error appears", """
        from concurrent.futures import ThreadPoolExecutor

        def upload(name, data):
            if not data:
                raise ValueError(f"{name} is empty")
            # ... send data to the storage service ...
            return len(data)

        def upload_all(files):
            with ThreadPoolExecutor(max_workers=4) as pool:
                for name, data in files.items():
                    pool.submit(upload, name, data)
            print(f"uploaded {len(files)} files")

        upload_all({"a.txt": b"alpha", "b.txt": b"", "c.txt": b"gamma"})
        """),
    "py_async_blocking_sleep": snippet("Python", "should poll three sensors concurrently in about 1 second, "
                                                 "but it takes about 3 seconds", """
        import asyncio
        import time

        async def poll_sensor(name):
            time.sleep(1)  # give the sensor time to settle
            return f"{name}: ok"

        async def main():
            start = time.perf_counter()
            names = ["hall", "attic", "garage"]
            results = await asyncio.gather(*(poll_sensor(n) for n in names))
            print(results, f"{time.perf_counter() - start:.1f}s")

        asyncio.run(main())
        """),
    "py_create_task_dropped": snippet("Python", "should save the draft in the background, but it prints "
                                                "\"ok\" and the \"draft saved\" line never appears", """
        import asyncio

        async def save_draft(text):
            await asyncio.sleep(0.1)  # stands in for a database write
            print("draft saved:", text)

        async def handle_edit(text):
            asyncio.create_task(save_draft(text))
            return "ok"

        async def main():
            print(await handle_edit("Dear team,"))

        asyncio.run(main())
        """),
    "py_queue_task_done_missing": snippet("Python", "should let three packers work through ten orders and "
                                                    "then print a summary, but it never prints \"packed 10 "
                                                    "orders\" and hangs forever", """
        import asyncio

        async def packer(queue, packed):
            while True:
                order_id = await queue.get()
                await asyncio.sleep(0.01)  # pack the parcel
                packed.append(order_id)

        async def main():
            queue = asyncio.Queue()
            packed = []
            workers = [asyncio.create_task(packer(queue, packed)) for _ in range(3)]
            for order_id in range(1, 11):
                queue.put_nowait(order_id)
            await queue.join()
            for w in workers:
                w.cancel()
            print("packed", len(packed), "orders")

        asyncio.run(main())
        """),
    "py_semaphore_per_call": snippet("Python", "should download at most two files at a time, but the printed "
                                               "counter climbs to \"active: 6\"", """
        import asyncio

        active = 0

        async def download(url):
            global active
            limit = asyncio.Semaphore(2)
            async with limit:
                active += 1
                print("downloading", url, "active:", active)
                await asyncio.sleep(0.1)  # stands in for the transfer
                active -= 1

        async def main():
            urls = [f"https://files.example.com/report-{i}.pdf" for i in range(6)]
            await asyncio.gather(*(download(u) for u in urls))

        asyncio.run(main())
        """),
    "py_dataclass_order_field": snippet("Python", "should sort support tickets with the most urgent (priority "
                                                  "1) first, but it prints ['Billing typo', 'Reset password', "
                                                  "'Site down']", """
        from dataclasses import dataclass

        @dataclass(order=True)
        class Ticket:
            title: str
            priority: int  # 1 is the most urgent

        tickets = [
            Ticket("Reset password", 3),
            Ticket("Site down", 1),
            Ticket("Billing typo", 2),
        ]
        print([t.title for t in sorted(tickets)])
        """),
    "py_default_factory_called": snippet("Python", "should stamp each chat message with the time it was "
                                                   "created, but creating a message fails with \"TypeError: "
                                                   "'datetime.datetime' object is not callable\"", """
        from dataclasses import dataclass, field
        from datetime import datetime

        @dataclass
        class ChatMessage:
            author: str
            text: str
            sent_at: datetime = field(default_factory=datetime.now())

        msg = ChatMessage("ana", "see you at 6")
        print(f"[{msg.sent_at:%H:%M}] {msg.author}: {msg.text}")
        """),
    "py_property_setter_recursion": snippet("Python", "should reject negative prices, but even "
                                                      "Product(\"Mug\", 8.5) fails with a RecursionError "
                                                      "(\"maximum recursion depth exceeded\")", """
        class Product:
            def __init__(self, name, price):
                self.name = name
                self.price = price

            @property
            def price(self):
                return self._price

            @price.setter
            def price(self, value):
                if value < 0:
                    raise ValueError("price cannot be negative")
                self.price = value

        mug = Product("Mug", 8.5)
        print(mug.name, mug.price)
        """),
    "py_super_init_missing": snippet("Python", "should let an express order collect items like any order, but "
                                               "express.add(\"SKU-7\", 2) fails with \"AttributeError: "
                                               "'ExpressOrder' object has no attribute 'items'\"", """
        class Order:
            def __init__(self, customer):
                self.customer = customer
                self.items = []

            def add(self, sku, qty):
                self.items.append((sku, qty))

        class ExpressOrder(Order):
            def __init__(self, customer, deadline):
                self.deadline = deadline

            def label(self):
                return f"EXPRESS for {self.customer} by {self.deadline}"

        express = ExpressOrder("Ana", "17:00")
        express.add("SKU-7", 2)
        """),
    "py_lru_cache_stale_method": snippet("Python", "should report the current number of units in stock, but "
                                                   "total_units() keeps returning 5 after 10 more units are "
                                                   "added", """
        from functools import lru_cache

        class Inventory:
            def __init__(self):
                self.stock = {}

            def add(self, sku, qty):
                self.stock[sku] = self.stock.get(sku, 0) + qty

            @lru_cache(maxsize=None)
            def total_units(self):
                return sum(self.stock.values())

        inv = Inventory()
        inv.add("lamp", 5)
        print(inv.total_units())
        inv.add("chair", 10)
        print(inv.total_units())
        """),
    "py_groupby_unsorted": snippet("Python", "should return one total per customer, but it prints [('ana', "
                                             "10), ('ben', 5), ('ana', 7)] instead of [('ana', 17), ('ben', "
                                             "5)]", """
        from itertools import groupby

        def totals_by_customer(orders):
            result = []
            for customer, group in groupby(orders, key=lambda o: o["customer"]):
                result.append((customer, sum(o["amount"] for o in group)))
            return result

        orders = [
            {"customer": "ana", "amount": 10},
            {"customer": "ben", "amount": 5},
            {"customer": "ana", "amount": 7},
        ]
        print(totals_by_customer(orders))
        """),
    "py_combinations_single_leg": snippet("Python", "should schedule a home and an away match for every pair "
                                                    "of teams, but four teams get 6 fixtures instead of 12 "
                                                    "and the Tigers never host the Lions", """
        from itertools import combinations

        def fixtures(teams):
            # every team hosts every other team once
            return [f"{home} vs {away}" for home, away in combinations(teams, 2)]

        schedule = fixtures(["Lions", "Tigers", "Bears", "Wolves"])
        print(len(schedule))
        print("\\n".join(schedule))
        """),
    "py_islice_list_batches": snippet("Python", "should split a list of customer ids into batches of 100, but "
                                                "batches(ids, 100) yields the first 100 ids over and over and "
                                                "never stops", """
        from itertools import islice

        def batches(items, size):
            while True:
                batch = list(islice(items, size))
                if not batch:
                    return
                yield batch

        ids = list(range(1, 251))
        for batch in batches(ids, 100):
            print(len(batch), batch[0], batch[-1])
        """),
    "py_binary_zero_base_case": snippet("Python", "should show a status register in binary, but to_binary(0) "
                                                  "returns an empty string instead of \"0\", so the display "
                                                  "reads \"flags: \"", """
        def to_binary(n):
            if n == 0:
                return ""
            return to_binary(n // 2) + str(n % 2)

        for value in (5, 12, 0):
            print("flags:", to_binary(value))
        """),
    "py_gcd_missing_return": snippet("Python", "should reduce a recipe ratio to lowest terms, but simplify(6, "
                                               "8) fails with \"TypeError: unsupported operand type(s) for "
                                               "//: 'int' and 'NoneType'\"", """
        def gcd(a, b):
            if b == 0:
                return a
            gcd(b, a % b)

        def simplify(flour, water):
            g = gcd(flour, water)
            return flour // g, water // g

        print(simplify(6, 8))
        """),
    "py_route_path_alias": snippet("Python", "should list every delivery route from the depot to stop C, but "
                                             "it prints [['depot'], ['depot']] instead of [['depot', 'A', "
                                             "'C'], ['depot', 'B', 'C']]", """
        def all_routes(graph, start, goal):
            routes = []
            path = [start]

            def walk(stop):
                if stop == goal:
                    routes.append(path)
                    return
                for nxt in graph.get(stop, []):
                    if nxt not in path:
                        path.append(nxt)
                        walk(nxt)
                        path.pop()

            walk(start)
            return routes

        graph = {"depot": ["A", "B"], "A": ["C"], "B": ["C"], "C": []}
        print(all_routes(graph, "depot", "C"))
        """),
    "py_memo_key_missing_zone": snippet("Python", "should price a parcel by weight and destination zone, but "
                                                  "shipping_cost(2, \"world\") returns 6.4, the domestic "
                                                  "price, when it is called after shipping_cost(2, "
                                                  "\"domestic\")", """
        BASE_RATES = {"domestic": 4.0, "europe": 9.5, "world": 15.0}
        _cost_cache = {}

        def shipping_cost(weight_kg, zone):
            if weight_kg in _cost_cache:
                return _cost_cache[weight_kg]
            cost = round(BASE_RATES[zone] + 1.2 * weight_kg, 2)
            _cost_cache[weight_kg] = cost
            return cost

        print(shipping_cost(2, "domestic"))
        print(shipping_cost(2, "world"))
        """),
    "py_shallow_copy_settings": snippet("Python", "should give each user their own settings, but after Alice "
                                                  "turns SMS on, Bob's settings also print {'email': True, "
                                                  "'sms': True}", """
        import copy

        DEFAULTS = {"theme": "light", "notifications": {"email": True, "sms": False}}

        def settings_for(overrides):
            settings = copy.copy(DEFAULTS)
            for section, value in overrides.items():
                if isinstance(value, dict):
                    settings[section].update(value)
                else:
                    settings[section] = value
            return settings

        alice = settings_for({"notifications": {"sms": True}})
        bob = settings_for({"theme": "dark"})
        print(bob["notifications"])
        """),
    "py_round_half_even": snippet("Python", "should give one loyalty point per 2 euros with halves rounded "
                                            "up, but loyalty_points(5) returns 2 instead of 3 while "
                                            "loyalty_points(7) correctly returns 4", """
        def loyalty_points(amount_spent):
            # one point per 2 euros spent, halves round up
            return round(amount_spent / 2)

        for spent in (4, 5, 7):
            print(spent, "->", loyalty_points(spent))
        """),
    "py_or_default_zero": snippet("Python", "should let callers turn retries off, but "
                                            "connect(\"db.internal\", retries=0) still returns retries 3", """
        def connect(host, retries=None, timeout=None):
            retries = retries or 3
            timeout = timeout or 10.0
            return {"host": host, "retries": retries, "timeout": timeout}

        print(connect("db.internal", retries=0))
        """),
    "py_closure_unbound_counter": snippet("Python", "should allow three calls and then refuse, but the first "
                                                    "call already fails with \"UnboundLocalError: cannot "
                                                    "access local variable 'calls' where it is not associated "
                                                    "with a value\"", """
        def make_rate_limiter(limit):
            calls = 0

            def allow():
                if calls >= limit:
                    return False
                calls += 1
                return True

            return allow

        allow = make_rate_limiter(3)
        print([allow() for _ in range(5)])
        """),
    "py_last_n_zero": snippet("Python", "should return the n most recent chat messages, but recent(messages, "
                                        "0) returns the whole history instead of an empty list", """
        def recent(messages, n):
            return messages[-n:]

        history = ["hi", "hello!", "lunch?", "sure", "12:30"]
        print(recent(history, 2))
        print(recent(history, 0))
        """),
    "py_bisect_grade_boundary": snippet("Python", "should give an A from 90 points up, but grade(90) returns "
                                                  "\"B\" and grade(80) returns \"C\"", """
        from bisect import bisect_left

        CUTOFFS = [60, 70, 80, 90]
        GRADES = "FDCBA"

        def grade(score):
            return GRADES[bisect_left(CUTOFFS, score)]

        for score in (55, 80, 90, 97):
            print(score, grade(score))
        """),
    "py_split_command_path_space": snippet("Python", "should print the size of a folder, but for "
                                                     "\"/home/ana/My Photos\" it fails with \"du: cannot "
                                                     "access '/home/ana/My'\" and a CalledProcessError", """
        import subprocess

        def folder_size(path):
            cmd = f"du -sh {path}"
            result = subprocess.run(cmd.split(), capture_output=True, text=True)
            if result.returncode != 0:
                print(result.stderr.strip())
            result.check_returncode()
            return result.stdout.split()[0]

        print(folder_size("/home/ana/My Photos"))
        """),
    "py_hash_ab_group": snippet("Python", "should keep each user in the same A/B test group, but the same "
                                          "user id lands in a different group after the service restarts", """
        def ab_group(user_id):
            return "B" if hash(user_id) % 2 else "A"

        def variant_for(user_id):
            group = ab_group(user_id)
            return {"A": "old-checkout", "B": "new-checkout"}[group]

        for uid in ["u-1001", "u-1002", "u-1003", "u-1004"]:
            print(uid, variant_for(uid))
        """),
    "py_decimal_from_float": snippet("Python", "should round invoice amounts half-up to the cent, but "
                                               "invoice_total(2.675, 1) returns 2.67 instead of 2.68", """
        from decimal import Decimal, ROUND_HALF_UP

        def invoice_total(unit_price, qty):
            total = Decimal(unit_price) * qty
            return total.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)

        print(invoice_total(2.675, 1))
        print(invoice_total(19.99, 3))
        """),
    # JavaScript
    "js_date_month_zero_based": snippet("JavaScript", "should parse an invoice due date, but "
                                                      "parseDueDate(\"2024-03-15\") prints \"Mon Apr 15 "
                                                      "2024\", so every invoice is flagged overdue a month "
                                                      "late", """
        function parseDueDate(text) {
            // due dates are stored as "YYYY-MM-DD"
            const [year, month, day] = text.split("-").map(Number);
            return new Date(year, month, day);
        }

        function isOverdue(invoice, today = new Date()) {
            return parseDueDate(invoice.dueDate) < today;
        }

        console.log(parseDueDate("2024-03-15").toDateString());
        """),
    "js_regex_global_test": snippet("JavaScript", "should list the malformed SKUs, but it prints [ "
                                                  "'XYZ-0001', 'bad' ] although XYZ-0001 is well formed; "
                                                  "every second valid SKU is reported", """
        const SKU_PATTERN = /^[A-Z]{3}-\\d{4}$/g;

        function invalidSkus(skus) {
            return skus.filter((sku) => !SKU_PATTERN.test(sku));
        }

        console.log(invalidSkus(["ABC-1234", "XYZ-0001", "QRS-9876", "bad"]));
        """),
    "js_json_stringify_map": snippet("JavaScript", "should persist sessions to disk, but the file always "
                                                   "contains {\"sessions\":{}} and every session is gone "
                                                   "after a restart", """
        const fs = require("fs");

        class SessionStore {
            constructor(file) {
                this.file = file;
                this.sessions = new Map();
            }

            set(id, data) {
                this.sessions.set(id, data);
                fs.writeFileSync(this.file, JSON.stringify({ sessions: this.sessions }));
            }

            load() {
                const saved = JSON.parse(fs.readFileSync(this.file, "utf8"));
                this.sessions = new Map(Object.entries(saved.sessions));
            }
        }
        """),
    "js_then_missing_return": snippet("JavaScript", "should fetch a user profile, but even when the request "
                                                    "succeeds it rejects with \"TypeError: Cannot read "
                                                    "properties of undefined (reading 'displayName')\"", """
        function loadProfile(userId) {
            return fetch(`/api/users/${userId}`)
                .then((response) => {
                    if (!response.ok) {
                        throw new Error(`HTTP ${response.status}`);
                    }
                    response.json();
                })
                .then((profile) => ({
                    name: profile.displayName,
                    avatar: profile.avatarUrl || "/img/default-avatar.png",
                }));
        }
        """),
    "js_array_fill_shared_rows": snippet("JavaScript", "should let seats with the same number in different "
                                                       "rows be booked separately, but book(hall, 1, 2) "
                                                       "throws \"seat 1-2 is taken\" right after seat 0-2 was "
                                                       "booked", """
        function makeSeatMap(rows, seatsPerRow) {
            return new Array(rows).fill(new Array(seatsPerRow).fill("free"));
        }

        function book(seatMap, row, seat) {
            if (seatMap[row][seat] !== "free") {
                throw new Error(`seat ${row}-${seat} is taken`);
            }
            seatMap[row][seat] = "booked";
        }

        const hall = makeSeatMap(3, 4);
        book(hall, 0, 2);
        book(hall, 1, 2);
        """),
    "js_numeric_key_order": snippet("JavaScript", "should return the two newest orders, but it prints [ 1040, "
                                                  "1041 ] instead of [ 1042, 1041 ]", """
        // The API sends orders newest first; keep that order, keyed by order number.
        function indexOrders(orders) {
            const byNumber = {};
            for (const order of orders) {
                byNumber[order.number] = order;
            }
            return byNumber;
        }

        function newestOrders(index, n) {
            return Object.values(index).slice(0, n);
        }

        const index = indexOrders([
            { number: 1042, total: 18.5 },
            { number: 1041, total: 7.25 },
            { number: 1040, total: 99.0 },
        ]);
        console.log(newestOrders(index, 2).map((order) => order.number));
        """),
    "js_boolean_comparator": snippet("JavaScript", "should list products from cheapest to most expensive, but "
                                                   "it prints [ 'Kettle', 'Toaster', 'Blender', 'Mixer' ], "
                                                   "the same order they started in", """
        const products = [
            { name: "Kettle", price: 35 },
            { name: "Toaster", price: 25 },
            { name: "Blender", price: 60 },
            { name: "Mixer", price: 45 },
        ];

        function byPrice(list) {
            return [...list].sort((a, b) => a.price > b.price);
        }

        console.log(byPrice(products).map((p) => p.name));
        """),
    "js_module_level_counter": snippet("JavaScript", "should number each queue's tickets from 1, but the "
                                                     "first billing ticket is \"BIL-0003\" instead of "
                                                     "\"BIL-0001\"", """
        let nextNumber = 1;

        function makeTicketCounter(prefix) {
            return function nextTicket() {
                const ticket = `${prefix}-${String(nextNumber).padStart(4, "0")}`;
                nextNumber += 1;
                return ticket;
            };
        }

        const support = makeTicketCounter("SUP");
        const billing = makeTicketCounter("BIL");
        console.log(support(), support(), billing());
        """),
    "js_typeof_null_merge": snippet("JavaScript", "should let a user switch the proxy off with { proxy: null "
                                                  "}, but mergeSettings fails with \"TypeError: Cannot "
                                                  "convert undefined or null to object\"", """
        function mergeSettings(base, overrides) {
            const result = { ...base };
            for (const [key, value] of Object.entries(overrides)) {
                if (typeof value === "object" && !Array.isArray(value)) {
                    result[key] = mergeSettings(base[key] || {}, value);
                } else {
                    result[key] = value;
                }
            }
            return result;
        }

        const defaults = { theme: "light", proxy: { host: "proxy.local", port: 3128 } };
        console.log(mergeSettings(defaults, { proxy: null }));
        """),
    "js_or_default_zero_qty": snippet("JavaScript", "should charge nothing for a line whose quantity was set "
                                                    "to 0 and count a line without a quantity as one item, "
                                                    "but the cart total is 25 instead of 13", """
        function lineTotal(item) {
            const qty = item.qty || 1;
            const discount = item.discountPct ?? 0;
            return item.unitPrice * qty * (1 - discount / 100);
        }

        const cart = [
            { sku: "PEN", unitPrice: 2.5, qty: 4 },
            { sku: "INK", unitPrice: 12, qty: 0 }, // removed by the customer
            { sku: "PAD", unitPrice: 3 },          // quantity never set
        ];
        console.log(cart.reduce((sum, item) => sum + lineTotal(item), 0));
        """),
    "js_default_param_null": snippet("JavaScript", "should fall back to the first page when a saved search "
                                                   "has no page, but for page: null it builds a query ending "
                                                   "in \"OFFSET -20\" and the database rejects it", """
        function bookingsQuery(page = 1, pageSize = 20) {
            const offset = (page - 1) * pageSize;
            return `SELECT * FROM bookings ORDER BY id LIMIT ${pageSize} OFFSET ${offset}`;
        }

        // saved searches store page: null when the user never paged
        const saved = { term: "spa", page: null };
        console.log(bookingsQuery(saved.page));
        """),
    "js_roles_substring_match": snippet("JavaScript", "should grant admin rights only to users with the admin "
                                                      "role, but a user whose roles header is "
                                                      "\"viewer,billing-admin\" is treated as an admin", """
        function parseSession(headers) {
            // the auth proxy sends roles as a comma-separated list, e.g. "editor,viewer"
            return {
                user: headers["x-user"],
                roles: headers["x-roles"] || "",
            };
        }

        function isAdmin(session) {
            return session.roles.includes("admin");
        }

        const session = parseSession({ "x-user": "kim", "x-roles": "viewer,billing-admin" });
        console.log(isAdmin(session));
        """),
    "js_readfile_buffer": snippet("JavaScript", "should list the non-comment lines of a hosts file, but it "
                                                "fails with \"TypeError: text.split is not a function\"", """
        const fs = require("fs");

        function readHosts(path) {
            const text = fs.readFileSync(path);
            return text
                .split("\\n")
                .map((line) => line.trim())
                .filter((line) => line && !line.startsWith("#"));
        }

        console.log(readHosts("/etc/hosts"));
        """),
    "js_setter_recursion": snippet("JavaScript", "should store e-mail addresses trimmed and in lower case, "
                                                 "but new Customer(\"Ada\", \" Ada@Example.com \") fails with "
                                                 "\"RangeError: Maximum call stack size exceeded\"", """
        class Customer {
            constructor(name, email) {
                this.name = name;
                this.email = email;
            }

            get email() {
                return this.email;
            }

            set email(value) {
                this.email = value.trim().toLowerCase();
            }
        }

        const customer = new Customer("Ada", " Ada@Example.com ");
        console.log(customer.email);
        """),
    "js_parsefloat_thousands": snippet("JavaScript", "should add up the amounts from a bank export, but "
                                                     "\"$1,299.00\" is read as 1 and it prints -32.10 instead "
                                                     "of 1265.90", """
        function parseAmount(text) {
            // amounts look like "$1,299.00" or "-$45.10"
            const negative = text.startsWith("-");
            const value = parseFloat(text.replace(/[-$]/g, ""));
            return negative ? -value : value;
        }

        const rows = ["$1,299.00", "-$45.10", "$12.00"];
        const total = rows.map(parseAmount).reduce((sum, amount) => sum + amount, 0);
        console.log(total.toFixed(2));
        """),
    "js_truncate_surrogate_pair": snippet("JavaScript", "should shorten chat messages for the notification "
                                                        "list, but the preview of \"Great game tonight 🎉🎉 see "
                                                        "you Friday\" ends in a broken character (a lone "
                                                        "\"\\ud83c\", shown as �) before the ellipsis", """
        function preview(message, maxLength = 20) {
            if (message.length <= maxLength) {
                return message;
            }
            return message.slice(0, maxLength) + "…";
        }

        const text = "Great game tonight 🎉🎉 see you Friday";
        console.log(JSON.stringify(preview(text)));
        """),
    "js_reduce_without_initial": snippet("JavaScript", "should add up the revenue of the day's orders, but it "
                                                       "prints \"[object Object]15\" instead of 25", """
        function dailyRevenue(orders) {
            return orders.reduce((sum, order) => sum + order.quantity * order.unitPrice);
        }

        const orders = [
            { id: "A-1", quantity: 2, unitPrice: 5 },
            { id: "A-2", quantity: 1, unitPrice: 15 },
        ];
        console.log(dailyRevenue(orders));
        """),
    "js_race_timer_not_cleared": snippet("JavaScript", "should give up on a slow stock check after 30 "
                                                       "seconds, but when the check answers at once the "
                                                       "script prints \"in stock: 4\" and then hangs for "
                                                       "another 30 seconds before it exits", """
        function withTimeout(promise, ms) {
            const timeout = new Promise((_, reject) => {
                setTimeout(() => reject(new Error(`timed out after ${ms} ms`)), ms);
            });
            return Promise.race([promise, timeout]);
        }

        async function checkStock(sku) {
            return 4; // stands in for a call to the warehouse API
        }

        async function main() {
            const stock = await withTimeout(checkStock("SKU-17"), 30000);
            console.log("in stock:", stock);
        }

        main();
        """),
    "js_object_cache_key": snippet("JavaScript", "should cache a shipping quote per parcel, but after the "
                                                 "first call every parcel gets the same price: a 20 kg "
                                                 "express parcel is quoted 6.19", """
        const quoteCache = {};

        function shippingQuote(parcel) {
            if (parcel in quoteCache) {
                return quoteCache[parcel];
            }
            const price = 4.99 + parcel.weightKg * 1.2 + (parcel.express ? 10 : 0);
            quoteCache[parcel] = price;
            return price;
        }

        console.log(shippingQuote({ weightKg: 1, express: false }));
        console.log(shippingQuote({ weightKg: 20, express: true }));
        """),
    "js_bitmask_precedence": snippet("JavaScript", "should let only users with the WRITE flag edit, but a "
                                                   "read-only user (permissions 1) may edit and a writer "
                                                   "(permissions 2) may not", """
        const Permission = { READ: 1, WRITE: 2, DELETE: 4 };

        function canEdit(user) {
            return (user.permissions & Permission.WRITE === Permission.WRITE) !== 0;
        }

        const reader = { name: "lee", permissions: Permission.READ };
        const writer = { name: "sam", permissions: Permission.WRITE };
        console.log(canEdit(reader), canEdit(writer));
        """),
    "js_split_env_value": snippet("JavaScript", "should read settings from a .env file, but DATABASE_URL "
                                                "\"postgres://app@db/shop?sslmode=require\" comes back as "
                                                "\"postgres://app@db/shop?sslmode\"", """
        function parseEnv(text) {
            const env = {};
            for (const line of text.split("\\n")) {
                if (!line.trim() || line.startsWith("#")) {
                    continue;
                }
                const [key, value] = line.split("=");
                env[key.trim()] = value.trim();
            }
            return env;
        }

        const env = parseEnv("PORT=8080\\nDATABASE_URL=postgres://app@db/shop?sslmode=require\\n");
        console.log(env.DATABASE_URL);
        """),
    "js_delete_leaves_hole": snippet("JavaScript", "should drop a song from the playlist, but afterwards it "
                                                   "still reports \"3 tracks\" and play(1) fails with "
                                                   "\"TypeError: Cannot read properties of undefined (reading "
                                                   "'title')\"", """
        class Playlist {
            constructor(tracks) {
                this.tracks = tracks;
            }

            remove(title) {
                const index = this.tracks.findIndex((track) => track.title === title);
                if (index !== -1) {
                    delete this.tracks[index];
                }
            }

            summary() {
                return `${this.tracks.length} tracks`;
            }

            play(position) {
                return `Now playing: ${this.tracks[position].title}`;
            }
        }

        const list = new Playlist([{ title: "Intro" }, { title: "Rain" }, { title: "Outro" }]);
        list.remove("Rain");
        console.log(list.summary());
        console.log(list.play(1));
        """),
    "js_tofixed_string_compare": snippet("JavaScript", "should pick the cheapest shop, but it picks shop B at "
                                                       "\"10.00\" over shop A at \"9.50\"", """
        function cheapestOffer(offers) {
            let best = null;
            for (const offer of offers) {
                const price = (offer.cents / 100).toFixed(2);
                if (best === null || price < best.price) {
                    best = { shop: offer.shop, price };
                }
            }
            return best;
        }

        console.log(cheapestOffer([
            { shop: "A", cents: 950 },
            { shop: "B", cents: 1000 },
        ]));
        """),
    "js_catch_hides_bad_config": snippet("JavaScript", "should fall back to defaults only when config.json "
                                                       "does not exist, but after a trailing comma slips into "
                                                       "config.json the service quietly starts on port 8080 "
                                                       "with none of the file's settings and logs no error", """
        const fs = require("fs");

        const DEFAULTS = { port: 8080, logLevel: "info", workers: 2 };

        function loadConfig(path = "config.json") {
            try {
                const text = fs.readFileSync(path, "utf8");
                return { ...DEFAULTS, ...JSON.parse(text) };
            } catch (err) {
                return { ...DEFAULTS };
            }
        }

        const config = loadConfig();
        console.log(`listening on ${config.port} with ${config.workers} workers`);
        """),
    "js_promise_never_settles": snippet("JavaScript", "should report an error when orders.json is missing, "
                                                      "but it logs \"cannot read orders.json\" and then exits "
                                                      "without ever running the .catch or .finally handlers", """
        const fs = require("fs");

        function readJson(path) {
            return new Promise((resolve, reject) => {
                fs.readFile(path, "utf8", (err, text) => {
                    if (err) {
                        console.error(`cannot read ${path}: ${err.code}`);
                        return;
                    }
                    try {
                        resolve(JSON.parse(text));
                    } catch (parseError) {
                        reject(parseError);
                    }
                });
            });
        }

        readJson("orders.json")
            .then((orders) => console.log(`${orders.length} orders`))
            .catch((err) => console.error("import failed:", err.message))
            .finally(() => console.log("done"));
        """),
    "js_encodeuri_query": snippet("JavaScript", "should search the catalogue for the phrase the user typed, "
                                                "but a search for \"salt & pepper\" only returns results for "
                                                "\"salt\"", """
        function searchUrl(base, term, page = 1) {
            return encodeURI(`${base}/search?q=${term}&page=${page}`);
        }

        async function search(term) {
            const response = await fetch(searchUrl("https://shop.example.com", term));
            return response.json();
        }

        console.log(searchUrl("https://shop.example.com", "salt & pepper"));
        """),
    "js_add_days_mutates": snippet("JavaScript", "should show the check-in and check-out dates of a booking, "
                                                 "but bookingSummary(new Date(2024, 5, 10), 3) prints \"Thu "
                                                 "Jun 13 2024 to Thu Jun 13 2024\"", """
        function addDays(date, days) {
            date.setDate(date.getDate() + days);
            return date;
        }

        function bookingSummary(checkIn, nights) {
            const checkOut = addDays(checkIn, nights);
            return `${checkIn.toDateString()} to ${checkOut.toDateString()}`;
        }

        console.log(bookingSummary(new Date(2024, 5, 10), 3));
        """),
    "js_sort_reorders_log": snippet("JavaScript", "should show the top three players without disturbing the "
                                                  "submission log, but afterwards the log's first entry is "
                                                  "the highest scorer (\"zoe\") instead of the earliest "
                                                  "submission (\"max\")", """
        const submissions = [
            { player: "max", points: 40 },
            { player: "ivy", points: 75 },
            { player: "zoe", points: 90 },
            { player: "raj", points: 55 },
        ];

        function topThree(scores) {
            const ranked = scores.sort((a, b) => b.points - a.points);
            return ranked.slice(0, 3).map((s) => s.player);
        }

        console.log("leaders:", topThree(submissions));
        console.log("first submission:", submissions[0].player);
        """),
    # TypeScript
    "ts_enum_zero_falsy": snippet("TypeScript", "should keep the priority a ticket was filed with, but "
                                                "tickets filed as Priority.Low come back as Normal", """
        enum Priority {
            Low,
            Normal,
            Urgent,
        }

        interface Ticket {
            title: string;
            priority?: Priority;
        }

        function effectivePriority(ticket: Ticket): Priority {
            return ticket.priority || Priority.Normal;
        }

        const ticket: Ticket = { title: "Printer jam", priority: Priority.Low };
        console.log(Priority[effectivePriority(ticket)]);
        """),
    "ts_partial_spread_undefined": snippet("TypeScript", "should fill in defaults for chart settings the user "
                                                         "left empty, but chartOptions returns height: "
                                                         "undefined instead of 480 and the chart is drawn "
                                                         "with no height", """
        interface ChartOptions {
            width: number;
            height: number;
            title: string;
        }

        const DEFAULTS: ChartOptions = { width: 640, height: 480, title: "Untitled" };

        function chartOptions(overrides: Partial<ChartOptions>): ChartOptions {
            return { ...DEFAULTS, ...overrides };
        }

        // the settings form reports untouched fields as undefined
        const fromForm = { width: 800, height: undefined, title: "Sales by region" };
        console.log(chartOptions(fromForm));
        """),
    "ts_generic_last_index": snippet("TypeScript", "should show the most recent sensor reading, but "
                                                   "currentTemperature fails with \"TypeError: Cannot read "
                                                   "properties of undefined (reading 'celsius')\" even when "
                                                   "there are readings", """
        interface Reading {
            sensorId: string;
            celsius: number;
            takenAt: Date;
        }

        function latest<T>(items: T[]): T {
            return items[items.length];
        }

        function currentTemperature(readings: Reading[]): string {
            const reading = latest(readings);
            return `${reading.celsius.toFixed(1)} °C`;
        }

        console.log(currentTemperature([
            { sensorId: "greenhouse", celsius: 21.4, takenAt: new Date("2024-05-01T08:00:00Z") },
            { sensorId: "greenhouse", celsius: 23.9, takenAt: new Date("2024-05-01T09:00:00Z") },
        ]));
        """),
    "ts_async_filter_predicate": snippet("TypeScript", "should drop expired and revoked coupons, but "
                                                       "usableCoupons returns every coupon, including ones "
                                                       "that expired last year", """
        import { fetchRevokedCodes } from "./api";

        interface Coupon {
            code: string;
            expiresAt: string;
        }

        async function isStillValid(coupon: Coupon): Promise<boolean> {
            const revoked = await fetchRevokedCodes();
            return !revoked.has(coupon.code) && new Date(coupon.expiresAt) > new Date();
        }

        export async function usableCoupons(coupons: Coupon[]): Promise<Coupon[]> {
            return coupons.filter(async (coupon) => await isStillValid(coupon));
        }
        """),
    "ts_json_date_field": snippet("TypeScript", "should list the guests arriving on a given day, but "
                                                "arrivalsOn fails with \"TypeError: b.checkIn.toDateString is "
                                                "not a function\" for bookings loaded from the API", """
        interface Booking {
            guest: string;
            checkIn: Date;
            nights: number;
        }

        async function loadBookings(url: string): Promise<Booking[]> {
            const response = await fetch(url);
            return (await response.json()) as Booking[];
        }

        function arrivalsOn(bookings: Booking[], day: Date): Booking[] {
            return bookings.filter((b) => b.checkIn.toDateString() === day.toDateString());
        }

        export async function todaysArrivals(): Promise<string[]> {
            const bookings = await loadBookings("/api/bookings");
            return arrivalsOn(bookings, new Date()).map((b) => b.guest);
        }
        """),
    "ts_record_prototype_keys": snippet("TypeScript", "should count the words of a review, but for a text "
                                                      "containing \"constructor\" that word's count is "
                                                      "\"function Object() { [native code] }1\" instead of 1", """
        function wordCounts(text: string): Record<string, number> {
            const counts: Record<string, number> = {};
            for (const word of text.toLowerCase().match(/[a-z']+/g) ?? []) {
                counts[word] = (counts[word] || 0) + 1;
            }
            return counts;
        }

        const counts = wordCounts("The constructor said the deck was fine");
        console.log(counts["the"], counts["constructor"]);
        """),
    "ts_object_assign_defaults": snippet("TypeScript", "should give each caller its own retry policy, but "
                                                       "pingPolicy comes out with attempts: 10 and backoff: "
                                                       "\"exponential\", which were only asked for the upload "
                                                       "policy", """
        interface RetryPolicy {
            attempts: number;
            delayMs: number;
            backoff: "fixed" | "exponential";
        }

        const DEFAULT_POLICY: RetryPolicy = { attempts: 3, delayMs: 200, backoff: "fixed" };

        function withDefaults<T extends object>(defaults: T, overrides: Partial<T>): T {
            return Object.assign(defaults, overrides);
        }

        const uploadPolicy = withDefaults(DEFAULT_POLICY, { attempts: 10, backoff: "exponential" });
        const pingPolicy = withDefaults(DEFAULT_POLICY, { delayMs: 50 });
        console.log(pingPolicy);
        """),
    "ts_enum_values_reverse_map": snippet("TypeScript", "should offer the three shirt sizes in a drop-down, "
                                                        "but sizeOptions() returns six options: Small, "
                                                        "Medium, Large, 0, 1 and 2", """
        enum ShirtSize {
            Small,
            Medium,
            Large,
        }

        interface Option {
            label: string;
            value: string;
        }

        function sizeOptions(): Option[] {
            return Object.values(ShirtSize).map((size) => ({
                label: String(size),
                value: String(size),
            }));
        }

        console.log(sizeOptions().map((option) => option.label));
        """),
    "ts_map_get_default_group": snippet("TypeScript", "should group shipments by carrier, but the map it "
                                                      "returns is always empty (byCarrier.size is 0)", """
        interface Shipment {
            id: string;
            carrier: string;
        }

        function groupBy<T, K>(items: T[], keyOf: (item: T) => K): Map<K, T[]> {
            const groups = new Map<K, T[]>();
            for (const item of items) {
                const key = keyOf(item);
                const group = groups.get(key) ?? [];
                group.push(item);
            }
            return groups;
        }

        const shipments: Shipment[] = [
            { id: "S1", carrier: "DHL" },
            { id: "S2", carrier: "UPS" },
            { id: "S3", carrier: "DHL" },
        ];
        const byCarrier = groupBy(shipments, (s) => s.carrier);
        console.log(byCarrier.size);
        """),
    "ts_retry_return_without_await": snippet("TypeScript", "should try a flaky upload up to three times, but "
                                                           "the first failure rejects the call at once and "
                                                           "\"attempt 1 failed, retrying\" is never logged", """
        async function retry<T>(task: () => Promise<T>, attempts = 3): Promise<T> {
            let lastError: unknown;
            for (let i = 1; i <= attempts; i++) {
                try {
                    return task();
                } catch (err) {
                    lastError = err;
                    console.warn(`attempt ${i} failed, retrying`);
                }
            }
            throw lastError;
        }

        let calls = 0;
        async function uploadReport(): Promise<string> {
            calls += 1;
            if (calls < 3) {
                throw new Error("503 Service Unavailable");
            }
            return "uploaded";
        }

        retry(uploadReport).then(console.log, (err) => console.error("gave up:", err.message));
        """),
    "ts_intl_currency_optional": snippet("TypeScript", "should format prices in US dollars when a price tag "
                                                       "has no currency, but formatPrice({ amount: 12.5 }) "
                                                       "throws \"TypeError: Currency code is required with "
                                                       "currency style.\"", """
        interface PriceTag {
            amount: number;
            currency?: string; // ISO 4217 code; US dollars when absent
        }

        function formatPrice(tag: PriceTag, locale = "en-US"): string {
            return new Intl.NumberFormat(locale, {
                style: "currency",
                currency: tag.currency,
            }).format(tag.amount);
        }

        console.log(formatPrice({ amount: 9.99, currency: "EUR" }));
        console.log(formatPrice({ amount: 12.5 }));
        """),
    "ts_structural_profile_leak": snippet("TypeScript", "should send only a user's id and display name, but "
                                                        "the JSON response also contains the user's e-mail "
                                                        "address and passwordHash", """
        import express from "express";
        import { db } from "./db";

        interface UserRecord {
            id: number;
            email: string;
            displayName: string;
            passwordHash: string;
        }

        interface PublicProfile {
            id: number;
            displayName: string;
        }

        function toPublicProfile(user: UserRecord): PublicProfile {
            return user;
        }

        const app = express();
        app.get("/users/:id", async (req, res) => {
            const user: UserRecord = await db.findUser(Number(req.params.id));
            res.json(toPublicProfile(user));
        });
        """),
    # C
    "c_fgets_newline": snippet("C", "should go ahead when the user types yes, but typing yes and pressing "
                                    "Enter always prints \"Cancelled.\"", """
        #include <stdio.h>
        #include <string.h>

        int confirm(const char *question) {
            char answer[16];
            printf("%s [yes/no] ", question);
            fflush(stdout);
            if (fgets(answer, sizeof answer, stdin) == NULL) {
                return 0;
            }
            return strcmp(answer, "yes") == 0;
        }

        int main(void) {
            if (confirm("Delete 3 old backups?")) {
                puts("Deleting backups...");
            } else {
                puts("Cancelled.");
            }
            return 0;
        }
        """),
    "c_macro_precedence": snippet("C", "should print what share of the tasks is finished, but "
                                       "print_progress(3, 1, 8) prints \"15% of tasks finished\" instead of "
                                       "50%", """
        #include <stdio.h>

        #define PERCENT(part, whole) (part * 100 / whole)

        void print_progress(int done, int skipped, int total) {
            printf("%d%% of tasks finished\\n", PERCENT(done + skipped, total));
        }

        int main(void) {
            print_progress(3, 1, 8);
            return 0;
        }
        """),
    "c_char_eof": snippet("C", "should count the bytes and lines piped into it, but for a JPEG photo it "
                               "prints \"0 bytes, 0 lines\", and other binary files stop being counted at the "
                               "first 0xFF byte (gcc on x86-64 Linux)", """
        #include <stdio.h>

        int main(void) {
            long bytes = 0, lines = 0;
            char c;
            while ((c = getchar()) != EOF) {
                bytes++;
                if (c == '\\n') {
                    lines++;
                }
            }
            printf("%ld bytes, %ld lines\\n", bytes, lines);
            return 0;
        }
        """),
    "c_strcmp_truthy": snippet("C", "should look a user up by name, but with the users alice, bob and carol, "
                                    "find_user(users, 3, \"bob\") returns alice and find_user(users, 3, "
                                    "\"alice\") returns bob", """
        #include <stddef.h>
        #include <string.h>

        struct user {
            const char *name;
            int id;
        };

        const struct user *find_user(const struct user *users, size_t n, const char *name) {
            for (size_t i = 0; i < n; i++) {
                if (strcmp(users[i].name, name)) {
                    return &users[i];
                }
            }
            return NULL;
        }
        """),
    "c_strtok_nested": snippet("C", "should print every role of every user, but it prints only \"alice -> "
                                    "admin\" and \"alice -> editor\", and bob is never listed", """
        #include <stdio.h>
        #include <string.h>

        /* spec looks like "alice:admin,editor;bob:viewer" */
        void print_roles(char *spec) {
            for (char *user = strtok(spec, ";"); user != NULL; user = strtok(NULL, ";")) {
                char *name = strtok(user, ":");
                char *roles = strtok(NULL, ":");
                for (char *role = strtok(roles, ","); role != NULL; role = strtok(NULL, ",")) {
                    printf("%s -> %s\\n", name, role);
                }
            }
        }

        int main(void) {
            char spec[] = "alice:admin,editor;bob:viewer";
            print_roles(spec);
            return 0;
        }
        """),
    "c_free_then_next": snippet("C", "should free every job in a queue, but AddressSanitizer reports a "
                                     "heap-use-after-free in free_queue, and gcc warns that pointer ‘j’ is "
                                     "used after ‘free’", """
        #include <stdlib.h>

        struct job {
            char name[32];
            int priority;
            struct job *next;
        };

        void free_queue(struct job *head) {
            for (struct job *j = head; j != NULL; j = j->next) {
                free(j);
            }
        }
        """),
    "c_qsort_subtract": snippet("C", "should sort accounts from lowest to highest balance, but an account "
                                     "holding 1500000000 cents stays ahead of one at -1500000000 cents, and "
                                     "-fsanitize=undefined reports a signed integer overflow in by_balance", """
        #include <stdlib.h>

        struct account {
            char id[12];
            int balance_cents;
        };

        static int by_balance(const void *a, const void *b) {
            const struct account *x = a;
            const struct account *y = b;
            return x->balance_cents - y->balance_cents;
        }

        void sort_by_balance(struct account *accounts, size_t n) {
            qsort(accounts, n, sizeof *accounts, by_balance);
        }
        """),
    "c_feof_loop": snippet("C", "should add up a file with one amount per line, but for a file holding 10.50, "
                                "20.00 and 5.25 it returns 41.00 instead of 35.75, counting the last amount "
                                "twice", """
        #include <stdio.h>

        double total_amount(const char *path) {
            FILE *f = fopen(path, "r");
            if (f == NULL) {
                return -1.0;
            }
            double total = 0.0, amount = 0.0;
            while (!feof(f)) {
                fscanf(f, "%lf", &amount);
                total += amount;
            }
            fclose(f);
            return total;
        }
        """),
    "c_ring_wrap": snippet("C", "should keep the last 8 temperature samples, but on the ninth sample "
                                "AddressSanitizer reports a global-buffer-overflow (a WRITE of size 8) in "
                                "add_sample", """
        #define CAPACITY 8

        static double samples[CAPACITY];
        static int head = 0;
        static int count = 0;

        void add_sample(double celsius) {
            samples[head] = celsius;
            head++;
            if (head > CAPACITY) {
                head = 0;
            }
            if (count < CAPACITY) {
                count++;
            }
        }

        double max_sample(void) {
            double max = samples[0];
            for (int i = 1; i < count; i++) {
                if (samples[i] > max) {
                    max = samples[i];
                }
            }
            return max;
        }
        """),
    "c_flag_precedence": snippet("C", "should allow writing only for users with the write permission, but "
                                      "can_write(PERM_READ) returns 1 and can_write(PERM_WRITE) returns 0", """
        #define PERM_READ  0x1
        #define PERM_WRITE 0x2
        #define PERM_ADMIN 0x4

        int can_write(unsigned perms) {
            return perms & PERM_WRITE == PERM_WRITE;
        }

        int can_delete(unsigned perms) {
            return can_write(perms) && (perms & PERM_ADMIN) != 0;
        }
        """),
    "c_static_buffer": snippet("C", "should print a room booking with its start and end times, but it prints "
                                    "\"Room A: 09:00-09:00\" instead of \"Room A: 09:00-10:30\"", """
        #include <stdio.h>

        const char *format_hhmm(int minutes) {
            static char buf[16];
            snprintf(buf, sizeof buf, "%02d:%02d", minutes / 60, minutes % 60);
            return buf;
        }

        void print_booking(const char *room, int start_min, int end_min) {
            printf("%s: %s-%s\\n", room, format_hhmm(start_min), format_hhmm(end_min));
        }

        int main(void) {
            print_booking("Room A", 540, 630);
            return 0;
        }
        """),
    # C++
    "cpp_map_lookup_inserts": snippet("C++", "should report only the products that were restocked, but after "
                                             "in_stock(\"kiwi\") is merely asked, the report also lists "
                                             "\"kiwi: 0\"", """
        #include <iostream>
        #include <map>
        #include <string>

        class Inventory {
        public:
            void restock(const std::string& sku, int qty) { stock_[sku] += qty; }

            bool in_stock(const std::string& sku) { return stock_[sku] > 0; }

            void report() const {
                for (const auto& [sku, qty] : stock_) {
                    std::cout << sku << ": " << qty << '\\n';
                }
            }

        private:
            std::map<std::string, int> stock_;
        };

        int main() {
            Inventory inv;
            inv.restock("apple", 5);
            if (!inv.in_stock("kiwi")) {
                std::cout << "kiwi is sold out\\n";
            }
            inv.report();
        }
        """),
    "cpp_ref_after_push_back": snippet("C++", "should mark the first ticket as escalated after queuing new "
                                              "ones, but called with a one-ticket queue and three new ids it "
                                              "crashes with a segmentation fault, and AddressSanitizer "
                                              "reports a heap-use-after-free on the assignment to first.status", """
        #include <string>
        #include <vector>

        struct Ticket {
            int id;
            std::string status;
        };

        void escalate_first(std::vector<Ticket>& queue, const std::vector<int>& new_ids) {
            Ticket& first = queue.front();
            for (int id : new_ids) {
                queue.push_back({id, "open"});
            }
            first.status = "escalated";
        }
        """),
    "cpp_nonvirtual_dtor": snippet("C++", "should write two lines to audit.log, but the file is empty after "
                                          "the program exits, and AddressSanitizer reports a "
                                          "new-delete-type-mismatch", """
        #include <fstream>
        #include <memory>
        #include <string>

        class Sink {
        public:
            virtual void write(const std::string& line) = 0;
        };

        class FileSink : public Sink {
        public:
            explicit FileSink(const std::string& path) : out_(path) {}
            void write(const std::string& line) override { out_ << line << '\\n'; }

        private:
            std::ofstream out_;
        };

        int main() {
            std::unique_ptr<Sink> audit = std::make_unique<FileSink>("audit.log");
            audit->write("login alice");
            audit->write("export report 42");
        }
        """),
    "cpp_shallow_copy_double_free": snippet("C++", "should keep messages in an inbox, but the program aborts "
                                                   "with \"free(): double free detected in tcache 2\" when it "
                                                   "exits", """
        #include <cstring>
        #include <vector>

        class Message {
        public:
            explicit Message(const char* text) : text_(new char[std::strlen(text) + 1]) {
                std::strcpy(text_, text);
            }
            ~Message() { delete[] text_; }

            const char* text() const { return text_; }

        private:
            char* text_;
        };

        int main() {
            std::vector<Message> inbox;
            inbox.push_back(Message("Your parcel has shipped"));
            return 0;
        }
        """),
    "cpp_lambda_dangling_ref": snippet("C++", "should return a function that takes a percentage off a price, "
                                              "but make_discount(20)(50.0) returns garbage such as "
                                              "3.47656e-308 instead of 40, and AddressSanitizer with "
                                              "detect_stack_use_after_return=1 reports a "
                                              "stack-use-after-return", """
        #include <functional>

        std::function<double(double)> make_discount(double percent) {
            double factor = 1.0 - percent / 100.0;
            return [&](double price) { return price * factor; };
        }
        """),
    "cpp_use_after_move": snippet("C++", "should log the name of each student it enrolls, but it prints "
                                         "\"Enrolled , class size 1\" with the name missing", """
        #include <iostream>
        #include <string>
        #include <vector>

        class Roster {
        public:
            void enroll(std::string name) {
                students_.push_back(std::move(name));
                std::cout << "Enrolled " << name << ", class size " << students_.size() << '\\n';
            }

        private:
            std::vector<std::string> students_;
        };

        int main() {
            Roster roster;
            roster.enroll("Priya");
            roster.enroll("Tomas");
        }
        """),
    "cpp_find_npos_truthy": snippet("C++", "should keep only the log lines that contain ERROR, but it keeps "
                                           "every line except the ones that start with ERROR", """
        #include <string>
        #include <vector>

        std::vector<std::string> error_lines(const std::vector<std::string>& lines) {
            std::vector<std::string> errors;
            for (const auto& line : lines) {
                if (line.find("ERROR")) {
                    errors.push_back(line);
                }
            }
            return errors;
        }
        """),
    "cpp_cache_key": snippet("C++", "should price a parcel by weight and zone, but once shipping_cost(2.0, 1) "
                                    "has returned 11, shipping_cost(2.0, 3) also returns 11 instead of 21", """
        #include <map>

        double shipping_cost(double weight_kg, int zone) {
            static std::map<double, double> cache;
            auto it = cache.find(weight_kg);
            if (it != cache.end()) {
                return it->second;
            }
            double rate = zone == 1 ? 4.0 : zone == 2 ? 6.5 : 9.0;
            double cost = 3.0 + rate * weight_kg;
            cache[weight_kg] = cost;
            return cost;
        }
        """),
    "cpp_remove_without_erase": snippet("C++", "should drop every occurrence of a cancelled order id, but for "
                                               "the ids {101, 102, 101, 103} and 101 the vector ends up as "
                                               "{102, 103, 101, 103} and still has 4 elements", """
        #include <algorithm>
        #include <vector>

        void drop_cancelled(std::vector<int>& order_ids, int cancelled_id) {
            std::remove(order_ids.begin(), order_ids.end(), cancelled_id);
        }
        """),
    "cpp_literal_plus_int": snippet("C++", "should return labels like \"Table 3\", but table_label(3) returns "
                                           "\"le \", and for table 7 and up it returns garbage while "
                                           "AddressSanitizer reports a global-buffer-overflow", """
        #include <string>

        std::string table_label(int table_number) {
            std::string label = "Table " + table_number;
            return label;
        }
        """),
    "cpp_shared_ptr_cycle": snippet("C++", "should print \"team billing closed\" when the team goes out of "
                                           "scope, but nothing is printed and LeakSanitizer reports memory "
                                           "leaks", """
        #include <iostream>
        #include <memory>
        #include <string>
        #include <vector>

        struct Employee;

        struct Team {
            std::string name;
            std::vector<std::shared_ptr<Employee>> members;
            ~Team() { std::cout << "team " << name << " closed\\n"; }
        };

        struct Employee {
            std::string name;
            std::shared_ptr<Team> team;
        };

        void add_member(const std::shared_ptr<Team>& team, const std::string& name) {
            auto employee = std::make_shared<Employee>();
            employee->name = name;
            employee->team = team;
            team->members.push_back(employee);
        }

        int main() {
            auto team = std::make_shared<Team>();
            team->name = "billing";
            add_member(team, "Dana");
        }
        """),
    # Rust
    "rust_byte_slice_boundary": snippet("Rust", "should shorten chat messages for a preview, but "
                                                "preview(\"Café au lait?\", 4) panics with \"byte index 4 is "
                                                "not a char boundary; it is inside 'é' (bytes 3..5)\"", """
        fn preview(message: &str, max: usize) -> String {
            if message.len() <= max {
                message.to_string()
            } else {
                format!("{}...", &message[..max])
            }
        }

        fn main() {
            println!("{}", preview("See you at 8", 6));
            println!("{}", preview("Café au lait?", 4));
        }
        """),
    "rust_u8_sum_overflow": snippet("Rust", "should count the stars over all reviews, but with 60 five-star "
                                            "reviews a debug build panics with \"attempt to add with "
                                            "overflow\" and a release build returns 44 instead of 300", """
        struct Review {
            author: String,
            stars: u8,
        }

        fn total_stars(reviews: &[Review]) -> u32 {
            reviews.iter().map(|r| r.stars).sum::<u8>() as u32
        }
        """),
    "rust_page_range": snippet("Rust", "should print a shopping list two items per page, but it prints only "
                                       "pages 1 and 2, and \"eggs\" on page 3 never appears", """
        fn page_count(items: usize, per_page: usize) -> usize {
            (items + per_page - 1) / per_page
        }

        fn print_pages(items: &[&str], per_page: usize) {
            for page in 1..page_count(items.len(), per_page) {
                let start = (page - 1) * per_page;
                let end = (start + per_page).min(items.len());
                println!("page {}: {}", page, items[start..end].join(", "));
            }
        }

        fn main() {
            print_pages(&["apples", "bread", "cheese", "dates", "eggs"], 2);
        }
        """),
    "rust_hashmap_order": snippet("Rust", "should build a word-count report sorted by word, but the lines "
                                          "come out in a different order on each run, so a snapshot test of "
                                          "the report passes only now and then", """
        use std::collections::HashMap;

        /// One "word: count" line per distinct word, sorted by word.
        fn word_report(text: &str) -> String {
            let mut counts: HashMap<&str, usize> = HashMap::new();
            for word in text.split_whitespace() {
                *counts.entry(word).or_insert(0) += 1;
            }
            let mut report = String::new();
            for (word, n) in &counts {
                report.push_str(&format!("{word}: {n}\\n"));
            }
            report
        }
        """),
    "rust_split_single_space": snippet("Rust", "should add up the scores on a line, but for \"90  85 77\" "
                                               "(two spaces after 90) it prints \"bad score line: cannot "
                                               "parse integer from empty string\"", """
        use std::num::ParseIntError;

        fn parse_scores(line: &str) -> Result<Vec<u32>, ParseIntError> {
            line.trim().split(' ').map(|s| s.parse::<u32>()).collect()
        }

        fn main() {
            match parse_scores("90  85 77") {
                Ok(scores) => println!("total: {}", scores.iter().sum::<u32>()),
                Err(e) => eprintln!("bad score line: {e}"),
            }
        }
        """),
    "rust_as_truncation": snippet("Rust", "should brighten an image, saturating each channel at 255, but "
                                          "scale_channel(200, 150) returns 44 instead of 255, so the "
                                          "brightest pixels turn dark", """
        /// Scales a colour channel by a percentage, saturating at 255.
        fn scale_channel(value: u8, percent: u32) -> u8 {
            (value as u32 * percent / 100) as u8
        }

        fn brighten(pixels: &mut [[u8; 3]], percent: u32) {
            for px in pixels.iter_mut() {
                for channel in px.iter_mut() {
                    *channel = scale_channel(*channel, percent);
                }
            }
        }
        """),
    "rust_negative_division": snippet("Rust", "should put readings into 10-degree bands, but band(-5) returns "
                                              "0 instead of -1, so -5 and 5 degrees are counted in the same "
                                              "band and -12 lands in band -1 instead of -2", """
        use std::collections::BTreeMap;

        /// Band n covers n*10 ..= n*10 + 9 degrees, so -10..=-1 is band -1.
        fn band(celsius: i32) -> i32 {
            celsius / 10
        }

        fn histogram(readings: &[i32]) -> BTreeMap<i32, usize> {
            let mut bands = BTreeMap::new();
            for &r in readings {
                *bands.entry(band(r)).or_insert(0) += 1;
            }
            bands
        }
        """),
    "rust_lazy_map": snippet("Rust", "should notify every user, but it prints \"0 notifications sent\", and "
                                     "the compiler warns about an unused `Map` that must be used", """
        struct Notifier {
            sent: Vec<String>,
        }

        impl Notifier {
            fn send(&mut self, user: &str) {
                self.sent.push(format!("Your order has shipped, {user}!"));
            }
        }

        fn notify_all(notifier: &mut Notifier, users: &[&str]) {
            users.iter().map(|user| notifier.send(user));
        }

        fn main() {
            let mut notifier = Notifier { sent: Vec::new() };
            notify_all(&mut notifier, &["ana", "bo", "cy"]);
            println!("{} notifications sent", notifier.sent.len());
        }
        """),
    "rust_remove_in_index_loop": snippet("Rust", "should drop expired sessions, but with three sessions of "
                                                 "which only the first has expired it panics with \"index out "
                                                 "of bounds: the len is 2 but the index is 2\"", """
        struct Session {
            user: String,
            expires_at: u64,
        }

        fn drop_expired(sessions: &mut Vec<Session>, now: u64) {
            for i in 0..sessions.len() {
                if sessions[i].expires_at <= now {
                    sessions.remove(i);
                }
            }
        }
        """),
    "rust_case_sort": snippet("Rust", "should list contacts alphabetically, but it prints [\"Alice\", "
                                      "\"Dave\", \"bob\", \"carol\"], with every capitalised name ahead of "
                                      "the lowercase ones", """
        fn contact_list(mut names: Vec<String>) -> Vec<String> {
            names.sort();
            names.dedup();
            names
        }

        fn main() {
            let names = vec!["bob", "Alice", "carol", "Dave", "bob"];
            let sorted = contact_list(names.into_iter().map(String::from).collect());
            println!("{:?}", sorted);
        }
        """),
    # Go
    "go_append_shared_backing": snippet("Go", "should build one deploy command per host, but all three "
                                              "commands print as [deploy --verbose --host=web3]", """
        package main

        import "fmt"

        func deployCommands(base []string, hosts []string) [][]string {
            cmds := make([][]string, 0, len(hosts))
            for _, h := range hosts {
                cmds = append(cmds, append(base, "--host="+h))
            }
            return cmds
        }

        func main() {
            base := make([]string, 0, 8)
            base = append(base, "deploy", "--verbose")
            for _, cmd := range deployCommands(base, []string{"web1", "web2", "web3"}) {
                fmt.Println(cmd)
            }
        }
        """),
    "go_json_unexported_fields": snippet("Go", "should print the invoice as JSON, but it prints just {} and "
                                               "no error", """
        package main

        import (
            "encoding/json"
            "fmt"
            "log"
        )

        type Invoice struct {
            number   string
            customer string
            total    float64
        }

        func main() {
            inv := Invoice{number: "INV-1042", customer: "Acme Ltd", total: 199.99}
            data, err := json.Marshal(inv)
            if err != nil {
                log.Fatal(err)
            }
            fmt.Println(string(data))
        }
        """),
    "go_range_unclosed_channel": snippet("Go", "should print a line per packed order and then \"all orders "
                                               "packed\", but after the four order lines it crashes with "
                                               "\"fatal error: all goroutines are asleep - deadlock!\"", """
        package main

        import (
            "fmt"
            "time"
        )

        func pack(orderID int, done chan<- string) {
            time.Sleep(50 * time.Millisecond) // stands in for real work
            done <- fmt.Sprintf("order %d packed", orderID)
        }

        func main() {
            orders := []int{101, 102, 103, 104}
            done := make(chan string)
            for _, id := range orders {
                go pack(id, done)
            }
            for msg := range done {
                fmt.Println(msg)
            }
            fmt.Println("all orders packed")
        }
        """),
    "go_duration_without_unit": snippet("Go", "should wait up to ResultTimeoutSeconds (5 in production) for a "
                                              "worker's result, but it returns \"context deadline exceeded\" "
                                              "almost at once, even when the result arrives after 200 ms", """
        type Config struct {
            ResultTimeoutSeconds int
        }

        func waitForResult(ctx context.Context, cfg Config, results <-chan Result) (Result, error) {
            ctx, cancel := context.WithTimeout(ctx, time.Duration(cfg.ResultTimeoutSeconds))
            defer cancel()

            select {
            case r := <-results:
                return r, nil
            case <-ctx.Done():
                return Result{}, ctx.Err()
            }
        }
        """),
    "go_typed_nil_error": snippet("Go", "should accept a booking for 2 guests and 3 nights, but it prints "
                                        "\"booking rejected: <nil>\"", """
        type ValidationError struct {
            Field string
        }

        func (e *ValidationError) Error() string {
            return "invalid " + e.Field
        }

        func validate(b Booking) error {
            var verr *ValidationError
            if b.Guests <= 0 {
                verr = &ValidationError{Field: "guests"}
            } else if b.Nights <= 0 {
                verr = &ValidationError{Field: "nights"}
            }
            return verr
        }

        func main() {
            if err := validate(Booking{Guests: 2, Nights: 3}); err != nil {
                fmt.Println("booking rejected:", err)
                return
            }
            fmt.Println("booking accepted")
        }
        """),
    "go_byte_initial": snippet("Go", "should return a person's initials, but initials(\"émile zola\") returns "
                                     "\"ÃZ\" instead of \"ÉZ\"", """
        func initials(fullName string) string {
            var b strings.Builder
            for _, part := range strings.Fields(fullName) {
                b.WriteString(strings.ToUpper(string(part[0])))
            }
            return b.String()
        }
        """),
    "go_scanner_err_ignored": snippet("Go", "should count the ERROR lines in a log file, but when the log "
                                            "holds a line longer than 64 KB (a long stack dump) it quietly "
                                            "stops there and returns a count that is too small with a nil "
                                            "error", """
        func countErrors(path string) (int, error) {
            f, err := os.Open(path)
            if err != nil {
                return 0, err
            }
            defer f.Close()

            count := 0
            sc := bufio.NewScanner(f)
            for sc.Scan() {
                if strings.Contains(sc.Text(), "ERROR") {
                    count++
                }
            }
            return count, nil
        }
        """),
    "go_time_layout": snippet("Go", "should save each day's sales to its own file such as "
                                    "sales-2024-03-15.csv, but every day is written to sales-YYYY-MM-DD.csv, "
                                    "overwriting the previous day", """
        func saveDailyReport(dir string, day time.Time, rows [][]string) error {
            path := filepath.Join(dir, "sales-"+day.Format("YYYY-MM-DD")+".csv")
            f, err := os.Create(path)
            if err != nil {
                return err
            }
            defer f.Close()
            return csv.NewWriter(f).WriteAll(rows)
        }
        """),
    # Java
    "java_boxed_integer_compare": snippet("Java", "should list the SKUs whose counted stock differs from the "
                                                  "expected stock, but a SKU counted at 200 with 200 expected "
                                                  "is reported as mismatched, while equal small counts such "
                                                  "as 40 and 40 are not", """
        static List<String> mismatchedSkus(Map<String, Integer> counted, Map<String, Integer> expected) {
            List<String> mismatched = new ArrayList<>();
            for (String sku : expected.keySet()) {
                Integer actual = counted.getOrDefault(sku, 0);
                if (actual != expected.get(sku)) {
                    mismatched.add(sku);
                }
            }
            Collections.sort(mismatched);
            return mismatched;
        }
        """),
    "java_bigdecimal_equals_scale": snippet("Java", "should mark an invoice as paid once its payments add up "
                                                    "to the total, but an invoice of 120.00 paid with two "
                                                    "payments entered as 100 and 20 stays unpaid", """
        record Payment(String invoiceId, BigDecimal amount) {}

        static boolean isFullyPaid(BigDecimal invoiceTotal, List<Payment> payments) {
            BigDecimal paid = BigDecimal.ZERO;
            for (Payment p : payments) {
                paid = paid.add(p.amount());
            }
            return paid.equals(invoiceTotal);
        }
        """),
    "java_fixed_size_list_remove": snippet("Java", "should turn a comma-separated recipient field into a "
                                                   "clean list of addresses, but "
                                                   "activeRecipients(\"a@x.com,,b@y.com\") throws "
                                                   "java.lang.UnsupportedOperationException: remove (input "
                                                   "without an empty entry works)", """
        static List<String> activeRecipients(String field) {
            List<String> emails = Arrays.asList(field.split(","));
            emails.replaceAll(String::trim);
            emails.removeIf(String::isEmpty);
            return emails;
        }
        """),
    "java_week_year_pattern": snippet("Java", "should name each nightly backup after its date, but the backup "
                                              "taken on 30 December 2024 is named backup-2025-12-30.tar.gz", """
        static final DateTimeFormatter DAY_FORMAT = DateTimeFormatter.ofPattern("YYYY-MM-dd");

        static Path archivePath(Path backupDir, LocalDate day) {
            String name = "backup-" + day.format(DAY_FORMAT) + ".tar.gz";
            return backupDir.resolve(name);
        }
        """),
    "java_comparator_cast_overflow": snippet("Java", "should sort calendar events oldest first, but an event "
                                                     "on 1 February 2024 is placed before one on 1 January "
                                                     "2024, while events a few days apart sort correctly", """
        record Event(String title, long startMillis) {}

        static List<Event> chronological(Collection<Event> events) {
            List<Event> sorted = new ArrayList<>(events);
            sorted.sort((a, b) -> (int) (a.startMillis() - b.startMillis()));
            return sorted;
        }
        """),
    "java_thread_run_not_start": snippet("Java", "should download five reports in parallel, but they download "
                                                 "one after another and the batch takes five times as long as "
                                                 "a single download", """
        void downloadAll(List<String> reportUrls) throws InterruptedException {
            List<Thread> workers = new ArrayList<>();
            for (String url : reportUrls) {
                Thread worker = new Thread(() -> download(url));
                workers.add(worker);
                worker.run();
            }
            for (Thread worker : workers) {
                worker.join();
            }
            log.info("downloaded {} reports", reportUrls.size());
        }
        """),
    "java_char_addition": snippet("Java", "should return the two initials shown in a user's avatar, but "
                                          "avatarText(\"jane doe\") returns \"142\" instead of \"JD\"", """
        static String avatarText(String fullName) {
            String[] parts = fullName.trim().split(" +");
            if (parts.length == 1) {
                return parts[0].substring(0, 1).toUpperCase();
            }
            char first = Character.toUpperCase(parts[0].charAt(0));
            char last = Character.toUpperCase(parts[parts.length - 1].charAt(0));
            return first + last + "";
        }
        """),
    "java_optional_orelse_eager": snippet("Java", "should create a guest account only for unknown email "
                                                  "addresses, but every login, even by an existing user, "
                                                  "inserts a new guest row into the users table", """
        User login(String email) {
            User user = users.findByEmail(email)
                    .orElse(users.createGuest(email));
            audit.record("login", user.id());
            return user;
        }
        """),
    "java_split_regex_dot": snippet("Java", "should compare two version strings, but it says every pair is "
                                            "equal: compareVersions(\"1.10.0\", \"1.9.2\") returns 0 instead "
                                            "of a positive number", """
        static int compareVersions(String a, String b) {
            String[] x = a.split(".");
            String[] y = b.split(".");
            for (int i = 0; i < Math.max(x.length, y.length); i++) {
                int p = i < x.length ? Integer.parseInt(x[i]) : 0;
                int q = i < y.length ? Integer.parseInt(y[i]) : 0;
                if (p != q) {
                    return Integer.compare(p, q);
                }
            }
            return 0;
        }
        """),
    "java_list_remove_by_index": snippet("Java", "should take a ticket off the waitlist, but after join(501) "
                                                 "and join(502), leave(502) throws "
                                                 "\"IndexOutOfBoundsException: Index 502 out of bounds for "
                                                 "length 2\"", """
        class Waitlist {
            private final List<Integer> ticketIds = new ArrayList<>();

            void join(int ticketId) {
                ticketIds.add(ticketId);
            }

            void leave(int ticketId) {
                ticketIds.remove(ticketId);
            }

            int position(int ticketId) {
                return ticketIds.indexOf(ticketId) + 1;
            }
        }
        """),
    "java_iterator_next_twice": snippet("Java", "should list the titles of overdue library loans, but when "
                                                "only \"Dune\" is overdue it returns [\"Emma\"], the loan "
                                                "after it, and it throws java.util.NoSuchElementException "
                                                "when the last loan is overdue", """
        record Loan(String title, LocalDate dueDate) {}

        static List<String> overdueTitles(List<Loan> loans, LocalDate today) {
            List<String> titles = new ArrayList<>();
            Iterator<Loan> it = loans.iterator();
            while (it.hasNext()) {
                if (it.next().dueDate().isBefore(today)) {
                    titles.add(it.next().title());
                }
            }
            return titles;
        }
        """),
    # C#
    "cs_linq_deferred_reenumeration": snippet("C#", "should return the shipments marked as dispatched, but "
                                                    "every shipment in the returned list still has Status "
                                                    "\"pending\" and DispatchedAt null", """
        public class Shipment
        {
            public int OrderId { get; set; }
            public string Status { get; set; } = "pending";
            public DateTime? DispatchedAt { get; set; }
        }

        public List<Shipment> DispatchAll(IEnumerable<int> orderIds)
        {
            var shipments = orderIds.Select(id => new Shipment { OrderId = id });
            foreach (var shipment in shipments)
            {
                shipment.Status = "dispatched";
                shipment.DispatchedAt = DateTime.UtcNow;
            }
            return shipments.ToList();
        }
        """),
    "cs_mutable_struct_copy": snippet("C#", "should count each team's wins and losses, but after processing a "
                                            "whole season every team still shows 0 wins and 0 losses", """
        public struct Tally
        {
            public int Wins;
            public int Losses;
        }

        public static Dictionary<string, Tally> BuildTable(IEnumerable<string> teams, IEnumerable<Game> games)
        {
            var table = new Dictionary<string, Tally>();
            foreach (var team in teams)
                table[team] = new Tally();

            foreach (var game in games)
            {
                var winner = table[game.Winner];
                winner.Wins++;
                var loser = table[game.Loser];
                loser.Losses++;
            }
            return table;
        }
        """),
    "cs_async_void_exception": snippet("C#", "should show \"Sync failed\" in the status bar when the server "
                                             "is down, but the catch block never runs and the desktop app "
                                             "crashes with an unhandled HttpRequestException", """
        public async void SyncContacts()
        {
            var response = await _http.GetAsync("api/contacts");
            response.EnsureSuccessStatusCode();
            var contacts = await response.Content.ReadFromJsonAsync<List<Contact>>();
            _store.ReplaceAll(contacts);
        }

        private void SyncButton_Click(object sender, RoutedEventArgs e)
        {
            try
            {
                SyncContacts();
                _status.Text = "Sync started";
            }
            catch (HttpRequestException ex)
            {
                _status.Text = "Sync failed: " + ex.Message;
            }
        }
        """),
    "cs_result_deadlock": snippet("C#", "should show today's report when the button is clicked, but the "
                                        "WinForms window freezes for good and the report never appears, "
                                        "although the same request works from a console app", """
        private void loadButton_Click(object sender, EventArgs e)
        {
            string report = LoadReportAsync().Result;
            reportBox.Text = report;
        }

        private async Task<string> LoadReportAsync()
        {
            using var response = await _http.GetAsync("reports/today");
            response.EnsureSuccessStatusCode();
            return await response.Content.ReadAsStringAsync();
        }
        """),
    "cs_local_time_vs_utc": snippet("C#", "should keep a login session valid for 30 minutes, but on the "
                                          "production server in Berlin every session is already invalid right "
                                          "after login, while on a developer machine set to UTC it works", """
        public class SessionStore
        {
            private readonly ConcurrentDictionary<string, DateTime> _expiry = new();

            public string Start(string userId)
            {
                var token = Guid.NewGuid().ToString("N");
                _expiry[token] = DateTime.UtcNow.AddMinutes(30);
                return token;
            }

            public bool IsValid(string token)
            {
                return _expiry.TryGetValue(token, out var expiresAt) && expiresAt > DateTime.Now;
            }
        }
        """),
    "cs_culture_toupper": snippet("C#", "should accept .jpg, .png, .gif and .tiff uploads in any letter case, "
                                        "but on computers set to Turkish it rejects \"logo.gif\" and "
                                        "\"scan.tiff\" while .jpg and .png files still pass", """
        private static readonly string[] ImageExtensions = { ".JPG", ".PNG", ".GIF", ".TIFF" };

        public static bool IsImage(string fileName)
        {
            string ext = Path.GetExtension(fileName).ToUpper();
            return ImageExtensions.Contains(ext);
        }
        """),
    "cs_boxed_reference_equality": snippet("C#", "should list only the settings that differ from their "
                                                 "defaults, but numeric settings such as \"retries\" = 3 with "
                                                 "a default of 3 are always listed as changed", """
        public static List<string> ChangedSettings(
            Dictionary<string, object> current, Dictionary<string, object> defaults)
        {
            var changed = new List<string>();
            foreach (var (key, value) in current)
            {
                if (defaults.TryGetValue(key, out var defaultValue) && value != defaultValue)
                {
                    changed.Add(key);
                }
            }
            return changed;
        }
        """),
    "cs_static_init_order": snippet("C#", "should add 20% VAT to a net price, but Pricing.Gross(100m) returns "
                                          "100 instead of 120", """
        public static class Pricing
        {
            public static readonly decimal VatMultiplier = 1 + VatRate;
            public static readonly decimal VatRate = 0.20m;

            public static decimal Gross(decimal net)
            {
                return Math.Round(net * VatMultiplier, 2, MidpointRounding.AwayFromZero);
            }
        }
        """),
    # SQL
    "sql_not_in_subquery_null": snippet("SQL", "should list the employees who manage nobody, but it returns "
                                               "no rows at all, although most employees have no reports", """
        SELECT e.id, e.name, e.department
        FROM employees AS e
        WHERE e.active = 1
          AND e.id NOT IN (SELECT manager_id FROM employees)
        ORDER BY e.department, e.name;
        """),
    "sql_join_fanout_sum": snippet("SQL", "should show how much each customer ordered and how much they paid, "
                                          "but an order of 100 paid in two instalments of 50 counts as 200 in "
                                          "the ordered column", """
        SELECT o.customer_id,
               SUM(o.total) AS ordered,
               SUM(p.amount) AS paid
        FROM orders AS o
        LEFT JOIN payments AS p ON p.order_id = o.id
        GROUP BY o.customer_id
        ORDER BY o.customer_id;
        """),
    "sql_null_arithmetic": snippet("SQL", "(SQLite) should report revenue per month, but order lines without "
                                          "a discount (discount is NULL) add nothing, so every month's "
                                          "revenue is far too low and some months are empty", """
        SELECT strftime('%Y-%m', o.placed_at) AS month,
               SUM(l.quantity * l.unit_price - l.discount) AS revenue
        FROM order_lines AS l
        JOIN orders AS o ON o.id = l.order_id
        GROUP BY month
        ORDER BY month;
        """),
    "sql_text_numeric_sort": snippet("SQL", "should list the five largest uploads, but a 9.5 MB file is "
                                            "listed above a 120 MB one", """
        -- size_mb was loaded from a CSV export into a TEXT column
        SELECT file_name, size_mb
        FROM uploads
        ORDER BY size_mb DESC
        LIMIT 5;
        """),
    "sql_and_or_precedence": snippet("SQL", "should list this year's shipped or delivered orders in the EU, "
                                            "but shipped orders from the US and from earlier years show up too", """
        SELECT id, customer_id, status, region, placed_at
        FROM orders
        WHERE status = 'shipped' OR status = 'delivered'
          AND region = 'EU'
          AND placed_at >= '2024-01-01'
        ORDER BY placed_at;
        """),
    "sql_count_star_left_join": snippet("SQL", "should show how many orders each customer has placed, but "
                                               "customers who have never ordered show 1 instead of 0", """
        SELECT c.id, c.name, COUNT(*) AS order_count
        FROM customers AS c
        LEFT JOIN orders AS o ON o.customer_id = c.id
        GROUP BY c.id, c.name
        ORDER BY order_count, c.name;
        """),
    "sql_correlated_update_nulls": snippet("SQL", "should apply this week's price changes, but afterwards "
                                                  "every product that is not listed in price_changes has a "
                                                  "NULL price", """
        UPDATE products
        SET price = (
            SELECT pc.new_price
            FROM price_changes AS pc
            WHERE pc.sku = products.sku
        );
        """),
    "sql_like_underscore_wildcard": snippet("SQL", "should delete the test accounts, whose usernames start "
                                                   "with \"test_\", but it also deletes real users such as "
                                                   "\"tester\" and \"testimony\"", """
        -- clean up the accounts left behind by the load-test scripts
        DELETE FROM accounts
        WHERE username LIKE 'test_%'
          AND created_at >= '2024-01-01'
          AND is_admin = 0;
        """),
    "sql_union_drops_duplicates": snippet("SQL", "should add up all money paid into each account, but an "
                                                 "account that received two card payments of 25.00 and a "
                                                 "transfer of 100.00 shows 125.00 instead of 150.00", """
        SELECT account_id, SUM(amount) AS total_in
        FROM (
            SELECT account_id, amount FROM card_payments
            UNION
            SELECT account_id, amount FROM bank_transfers
        ) AS incoming
        GROUP BY account_id
        ORDER BY account_id;
        """),
    "sql_case_branch_order": snippet("SQL", "should grade exam results, but nobody ever gets merit or "
                                            "distinction: a score of 92 is graded 'pass'", """
        SELECT student_id,
               score,
               CASE
                   WHEN score >= 50 THEN 'pass'
                   WHEN score >= 70 THEN 'merit'
                   WHEN score >= 85 THEN 'distinction'
                   ELSE 'fail'
               END AS grade
        FROM exam_results
        ORDER BY score DESC;
        """),
    "sql_window_missing_order": snippet("SQL", "should show each account's running balance after every ledger "
                                               "entry, but every row of an account shows the same final "
                                               "balance", """
        SELECT account_id,
               posted_on,
               amount,
               SUM(amount) OVER (PARTITION BY account_id) AS balance
        FROM ledger
        ORDER BY account_id, posted_on;
        """),
    "sql_distinct_on_wrong_direction": snippet("SQL", "(PostgreSQL) should show the latest tracking scan of "
                                                      "every parcel, but parcels that were delivered days ago "
                                                      "still show the status 'label created'", """
        SELECT DISTINCT ON (parcel_id)
               parcel_id, status, location, scanned_at
        FROM tracking_events
        WHERE scanned_at >= now() - interval '30 days'
        ORDER BY parcel_id, scanned_at;
        """),
    # Bash
    "sh_set_e_arith_zero": snippet("Bash", "should move every order file to done/ and print how many it "
                                           "moved, but it stops silently after moving the first file and "
                                           "exits with status 1", """
        #!/bin/bash
        set -euo pipefail

        moved=0
        for order in incoming/*.json; do
            grep -q '"id"' "$order"
            mv "$order" done/
            ((moved++))
        done
        echo "moved $moved orders"
        """),
    "sh_local_masks_status": snippet("Bash", "should stop with \"could not fetch config\" when the config "
                                             "server is down, but that message never appears: the function "
                                             "returns 0 and writes an empty config.json", """
        #!/bin/bash
        CONFIG_URL="https://config.internal/app.json"

        fetch_config() {
            local body=$(curl -fsS "$CONFIG_URL")
            if [ $? -ne 0 ]; then
                echo "could not fetch config" >&2
                return 1
            fi
            printf '%s\\n' "$body" > config.json
        }

        fetch_config || exit 1
        """),
    "sh_glob_no_match": snippet("Bash", "should convert new invoices to text and move them away, but when the "
                                        "inbox is empty every run fails with \"mv: cannot stat "
                                        "'/srv/uploads/inbox/*.pdf': No such file or directory\"", """
        #!/bin/bash
        inbox=/srv/uploads/inbox

        for invoice in "$inbox"/*.pdf; do
            name=$(basename "$invoice" .pdf)
            pdftotext "$invoice" "/srv/uploads/text/$name.txt"
            mv "$invoice" /srv/uploads/processed/
        done
        """),
    "sh_string_vs_numeric_compare": snippet("Bash", "should lock accounts with more than 5 failed logins, but "
                                                    "a user with 6 failures is locked while users with 12 or "
                                                    "40 failures are not", """
        #!/bin/bash
        max_failures=5

        # failures.txt has one "user count" pair per line
        while read -r user failures; do
            if [[ $failures > $max_failures ]]; then
                usermod -L "$user"
                echo "locked $user after $failures failed logins"
            fi
        done < failures.txt
        """),
    "sh_leading_zero_octal": snippet("Bash", "should print how many days are left in the month, but on the "
                                             "8th and 9th it fails with \"08: value too great for base (error "
                                             "token is \"08\")\"", """
        #!/bin/bash
        today=${1:-$(date +%F)}
        day=$(date -d "$today" +%d)
        last=$(date -d "$(date -d "$today" +%Y-%m-01) +1 month -1 day" +%d)
        echo "$((last - day)) days left this month"
        """),
    "sh_unchecked_cd_rm": snippet("Bash", "should empty the thumbnail cache, but on a machine where "
                                          "~/.cache/thumbnails did not exist it deleted every file in the "
                                          "directory the script was started from", """
        #!/bin/bash
        cache_dir="$HOME/.cache/thumbnails"

        cd "$cache_dir"
        rm -rf -- *
        echo "thumbnail cache cleared"
        """),
    "sh_read_without_r": snippet("Bash", "should count the log lines that match each pattern in alerts.csv, "
                                         "but the line errors,\\bERROR\\b always reports 0 although app.log "
                                         "has many ERROR lines", """
        #!/bin/bash
        # alerts.csv: one "name,extended-regex" pair per line
        while IFS=, read name pattern; do
            count=$(grep -cE -- "$pattern" app.log)
            echo "$name: $count"
        done < alerts.csv
        """),
    "sh_ssh_eats_stdin": snippet("Bash", "should print the root disk usage of every server in servers.txt, "
                                         "but it only reports the first server and then finishes without any "
                                         "error", """
        #!/bin/bash
        while read -r host; do
            echo "== $host"
            ssh "$host" 'df -h / | tail -n 1'
        done < servers.txt
        """),
    "sh_tee_hides_status": snippet("Bash", "should skip the deploy when the build fails, but after a failing "
                                           "build it still copies the jar and restarts the service", """
        #!/bin/bash
        cd /srv/app || exit 1

        ./gradlew build 2>&1 | tee build.log
        if [ $? -ne 0 ]; then
            echo "build failed, not deploying" >&2
            exit 1
        fi
        cp build/libs/app.jar /opt/app/
        systemctl restart app
        """),
}

ASKS: dict[str, str] = {
    **DEBUG_ASKS,
    "every_problem": "Go through the code line by line and list every problem you see, the one behind the symptom "
                     "first. For each, say what goes wrong and on which input, then give a corrected version.",
    "root_cause": "Explain the root cause first, then why the symptom looks exactly the way it does, and only then "
                  "the smallest change that fixes it.",
    "fix_with_tests": "Give the fixed code and three unit tests: the reported case, an edge case, and a case that "
                      "would have caught this bug before it shipped.",
    "short_lesson": "Explain the mistake as a short lesson: the concept behind it, the fix, and a rule of thumb "
                    "that prevents it.",
    "two_fixes": "Suggest two different ways to fix it, compare them on readability, performance and risk, and "
                 "recommend one.",
    "narrow_down": "Before giving the answer, describe how you would narrow this down yourself: what you would "
                   "print or check first, and what each result would tell you. Then give the fix.",
}
FRAMES: dict[str, str] = {
    **DEBUG_FRAMES,
    "on_call": "I am on call and this started failing tonight.",
    "inherited": "I inherited this {language} code from a team that has moved on.",
    "interview_practice": "This came up while I was practising for a technical interview.",
    "side_project": "This is from a small side project of mine.",
}
TEMPLATES: tuple[str, ...] = DEBUG_TEMPLATES + (
    "{frame} Here is some {language} that {symptom}.\n\n```{fence}\n{code}\n```\n\n{ask}",
)


def debugging_text(snippet_key: str, ask: str, frame: str) -> str:
    """The prompt for one snippet x ask x frame (keys of ``SNIPPETS``, ``ASKS``, ``FRAMES``)."""
    return snippet_prompt(f"{NAME}/{snippet_key}/{ask}/{frame}", SNIPPETS[snippet_key], ASKS[ask], FRAMES[frame],
                          TEMPLATES)


class CodeDebuggingWorkload(Workload):
    """Every snippet x ask x frame as one request."""

    NAME = NAME

    def load_pool(self) -> list[Prompt]:
        refuse_path(NAME, self.spec.path, "'custom' with path= for a prompt file")
        return [user_turn_prompt(f"{NAME}/{s}/{a}/{f}", debugging_text(s, a, f), f"{NAME}:{SNIPPETS[s].fence}")
                for s, a, f in product(SNIPPETS, ASKS, FRAMES)]


__all__ = ["ASKS", "FRAMES", "NAME", "SNIPPETS", "TEMPLATES", "CodeDebuggingWorkload", "debugging_text"]
