"""Worked problems: debugging, math word problems and reasoning puzzles, built combinatorially for training.

The drafter's held-out accept length on the arena-hard-style workload is lowest on its
debugging and math questions. The training-only ``hard_questions`` source covers
explanations, comparisons, coding, design, writing and diagnosis, but never asks the
target to find a bug in a given piece of code, to solve a word problem with concrete
numbers, or to work through a logic puzzle, so the drafter never sees the target's
step-by-step answers to such questions. This source fills that gap for TRAINING, in three
categories written for this project (nothing is taken from arena-hard-auto or any data set,
nor from the packaged ``arena_hard`` questions):

- ``debug``: a short snippet (Python, JavaScript, TypeScript, C, C++, Go, Rust, Java, C#,
  SQL, Bash) with one planted bug and a stated symptom, embedded as a fenced code block,
  x a way of asking (explain to a junior, minimal fix and regression test, ...) x how the
  code reached the asker;
- ``math``: word problems (rates, percentages, mixtures, work, probability, geometry,
  growth, unit conversion, ages, counting, ...) whose numbers come from small fixed lists of
  cases, x a way of asking for the step-by-step solution; a case a template cannot solve
  sensibly (a mixture target outside its ingredients, say) is refused when the pool loads;
- ``reasoning``: logic and reasoning puzzles (knights and knaves, seating and finishing
  orders, who-owns-what, river crossings, weighings, scheduling, Fermi estimates, ...)
  over setups x themes, x a way of asking; the deduction puzzles have exactly one solution
  (``tests/test_worked_problems.py`` solves them).

Ids are ``worked_problems/<category>/<item>/<variant>.../<ask>``, built from keys (or, for
a numeric case, its values), so ids and the train/eval split (the id hash of every source)
never change when a list grows. Use: drafter training (``split=train``); the ``eval`` split
measures held-out loss, and the benchmark's arena-hard-style workload stays ``arena_hard``.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from itertools import product
from typing import Callable, Union

from .base import Prompt, Workload, WorkloadError, pick_by_id, refuse_path, user_turn_prompt

Value = Union[int, float, str]
Fills = dict[str, str]


def format_value(value: Value) -> str:
    """A case value as prompt text: integers from 1,000 up with thousands separators, the rest as written."""
    if isinstance(value, int) and abs(value) >= 1000:
        return f"{value:,}"
    return str(value)


def case_key(values: tuple[Value, ...]) -> str:
    """The id part of a numeric case: its values joined by '-' (so a case keeps its id when a list grows)."""
    return "-".join(str(v).replace(" ", "_").replace(":", "") for v in values)


# --- debug ------------------------------------------------------------------------------------

FENCES: dict[str, str] = {
    "Python": "python", "JavaScript": "javascript", "TypeScript": "typescript", "C": "c", "C++": "cpp",
    "Go": "go", "Rust": "rust", "Java": "java", "C#": "csharp", "SQL": "sql", "Bash": "bash",
}


@dataclass(frozen=True)
class Snippet:
    """A short piece of code with one planted bug; ``symptom`` completes "This <language> code ..."."""

    language: str
    symptom: str
    code: str

    @property
    def fence(self) -> str:
        return FENCES[self.language]


def snippet(language: str, symptom: str, code: str) -> Snippet:
    """A :class:`Snippet` with ``code`` dedented and stripped of its surrounding blank lines."""
    return Snippet(language, symptom, textwrap.dedent(code).strip("\n"))


SNIPPETS: dict[str, Snippet] = {
    # Python
    "py_window_off_by_one": snippet("Python", "should return the sum of every run of k consecutive values, but "
                                    "window_sums([1, 2, 3, 4], 2) returns [3, 5] instead of [3, 5, 7]", """
        def window_sums(values, k):
            sums = []
            for start in range(len(values) - k):
                sums.append(sum(values[start:start + k]))
            return sums
        """),
    "py_mutable_default": snippet("Python", "should start a fresh guest list unless one is passed in, but the "
                                  "second call prints ['Ann', 'Bob'] instead of ['Bob']", """
        def add_guest(name, guests=[]):
            guests.append(name.strip().title())
            return guests

        first_party = add_guest("ann")
        second_party = add_guest("bob")
        print(second_party)
        """),
    "py_progress_int_division": snippet("Python", "should draw a progress bar that fills up gradually, but the bar "
                                        "stays completely empty until the very last item is done", """
        def progress_bar(done, total, width=20):
            filled = done // total * width
            return "[" + "#" * filled + "." * (width - filled) + "]"

        for done in range(0, 101, 25):
            print(progress_bar(done, 100))
        """),
    "py_missing_await": snippet("Python", "should add up the value of a portfolio, but it fails with "
                                "\"TypeError: unsupported operand type(s) for *: 'coroutine' and 'int'\" and a "
                                "warning that a coroutine was never awaited", """
        import asyncio

        async def fetch_price(symbol):
            await asyncio.sleep(0.1)  # stands in for a network call
            return {"ACME": 12.5, "GLOBEX": 40.0}[symbol]

        async def portfolio_value(holdings):
            total = 0.0
            for symbol, shares in holdings.items():
                price = fetch_price(symbol)
                total += price * shares
            return total

        print(asyncio.run(portfolio_value({"ACME": 10, "GLOBEX": 3})))
        """),
    "py_late_binding": snippet("Python", "should build functions that multiply by 1, 2 and 3, but it prints "
                               "[30, 30, 30] instead of [10, 20, 30]", """
        scalers = [lambda x: x * n for n in range(1, 4)]
        print([scale(10) for scale in scalers])
        """),
    "py_lock_not_released": snippet("Python", "should record events from several threads, but after the first "
                                    "event without an id every later call to record hangs forever", """
        import threading

        lock = threading.Lock()
        events = []

        def record(event):
            lock.acquire()
            if not event.get("id"):
                raise ValueError("event without id")
            events.append(event)
            lock.release()
        """),
    "py_is_vs_equals": snippet("Python", "should recognise administrators, but it returns False for every user "
                               "loaded from the JSON file, although a test that builds the dict by hand passes", """
        import json

        def is_admin(user):
            return user.get("role") is "admin"

        with open("users.json") as f:
            users = json.load(f)
        admins = [u["name"] for u in users if is_admin(u)]
        """),
    "py_dict_mutation": snippet("Python", "should drop expired sessions, but it crashes with "
                                "\"RuntimeError: dictionary changed size during iteration\"", """
        def drop_expired(sessions, now):
            for token, expires_at in sessions.items():
                if expires_at < now:
                    del sessions[token]
            return sessions
        """),
    "py_float_equality": snippet("Python", "should report that ten payments of 0.10 settle a bill of 1.00, but it "
                                 "prints \"still owing 1.1102230246251565e-16\"", """
        owed = 1.0
        paid = 0.0
        for _ in range(10):
            paid += 0.1
        if paid == owed:
            print("paid in full")
        else:
            print("still owing", owed - paid)
        """),
    "py_generator_reused": snippet("Python", "should count the rows and then process each one, but process is "
                                   "never called although the count is correct", """
        def parse_rows(lines):
            return (line.rstrip("\\n").split(",") for line in lines if line.strip())

        with open("orders.csv") as f:
            rows = parse_rows(f)
            print("rows:", len(list(rows)))
            for row in rows:
                process(row)
        """),
    "py_default_now": snippet("Python", "should stamp each log line with the time it was written, but every line "
                              "carries the same time, the moment the program started", """
        from datetime import datetime

        def log_line(message, when=datetime.now()):
            return f"{when:%H:%M:%S} {message}"

        print(log_line("started"))
        """),
    "py_discarded_result": snippet("Python", "should return the distinct names ignoring case and surrounding "
                                   "spaces, but ' Alice', 'alice' and 'ALICE ' all come back as separate names",
                                   """
        def distinct_names(names):
            for name in names:
                name.strip().lower()
            return sorted(set(names))
        """),
    "py_flatten_missing_else": snippet("Python", "should flatten nested lists, but flatten([1, [2, 3]]) returns "
                                       "[1, 2, 3, [2, 3]] instead of [1, 2, 3]", """
        def flatten(items):
            out = []
            for item in items:
                if isinstance(item, list):
                    out.extend(flatten(item))
                out.append(item)
            return out
        """),
    "py_shadowed_builtin": snippet("Python", "should return the distinct words of a text in order, but it fails "
                                   "with \"TypeError: 'list' object is not callable\"", """
        def distinct_words(text):
            list = text.lower().split()
            seen = set(list)
            return sorted(list(seen))
        """),
    # JavaScript and TypeScript
    "js_foreach_async": snippet("JavaScript", "should save every record before closing the database, but it logs "
                                "\"all saved\" early and some inserts fail with \"connection closed\"", """
        async function saveAll(records, db) {
          records.forEach(async (record) => {
            await db.insert(record);
          });
          console.log("all saved");
          await db.close();
        }
        """),
    "js_string_concat": snippet("JavaScript", "should add the quantity typed into a number field to the cart, but "
                                "the cart count goes from 1 to \"12\" to \"123\"", """
        function addToCart(cart, input) {
          const qty = input.value;
          cart.count = cart.count + qty;
          renderBadge(cart.count);
          return cart.count;
        }
        """),
    "js_this_in_callback": snippet("JavaScript", "should count seconds since start, but timer.ticks stays at 0 "
                                   "however long the page stays open", """
        class Stopwatch {
          constructor() {
            this.ticks = 0;
          }
          start() {
            this.handle = setInterval(function () {
              this.ticks++;
            }, 1000);
          }
        }
        const timer = new Stopwatch();
        timer.start();
        """),
    "js_default_sort": snippet("JavaScript", "should print the median latency, but it reports 15 ms although most "
                               "requests take more than 90 ms", """
        const latenciesMs = [120, 95, 1000, 15, 300];
        latenciesMs.sort();
        const median = latenciesMs[Math.floor(latenciesMs.length / 2)];
        console.log(`median: ${median} ms`);
        """),
    "js_shallow_copy": snippet("JavaScript", "should give every new settings object its own tag list, but each "
                               "object ends up holding the tags of all earlier calls", """
        const defaults = { theme: "light", tags: [] };

        function makeSettings(tag) {
          const settings = { ...defaults };
          settings.tags.push(tag);
          return settings;
        }
        """),
    "js_last_n_off_by_one": snippet("JavaScript", "should return the last n items of an array, but the result "
                                    "always ends with an extra undefined", """
        function lastN(items, n) {
          const out = [];
          for (let i = items.length - n; i <= items.length; i++) {
            out.push(items[i]);
          }
          return out;
        }
        """),
    "js_map_parseint": snippet("JavaScript", "should read a list of port numbers from an environment variable, "
                               "but with PORTS=8080,8081,8082 it yields [8080, NaN, NaN]", """
        const ports = (process.env.PORTS || "8080").split(",").map(parseInt);
        for (const port of ports) {
          startServer(port);
        }
        """),
    "js_index_of_truthy": snippet("JavaScript", "should tell whether a post carries a tag, but it says no for the "
                                  "post's first tag and yes for tags the post does not have", """
        function hasTag(post, tag) {
          if (post.tags.indexOf(tag)) {
            return true;
          }
          return false;
        }
        """),
    "ts_non_null_assertion": snippet("TypeScript", "should total an order where a missing quantity means one item, "
                                     "but the total comes out as NaN whenever a line has no qty", """
        interface Line {
          sku: string;
          price: number;
          qty?: number;
        }

        function orderTotal(lines: Line[]): number {
          return lines.reduce((sum, line) => sum + line.price * line.qty!, 0);
        }
        """),
    # C and C++
    "c_missing_terminator": snippet("C", "should return a heap copy of a string, but valgrind reports an invalid "
                                    "write of size 1 and the program sometimes crashes later in free", """
        #include <stdlib.h>
        #include <string.h>

        char *copy_name(const char *src) {
            char *dst = malloc(strlen(src));
            if (dst == NULL) return NULL;
            strcpy(dst, src);
            return dst;
        }
        """),
    "c_integer_average": snippet("C", "should print the average of the readings, but for the readings 1 and 2 it "
                                 "prints 1.000000 instead of 1.500000", """
        #include <stdio.h>

        double average(const int *xs, int n) {
            int sum = 0;
            for (int i = 0; i < n; i++) sum += xs[i];
            return sum / n;
        }

        int main(void) {
            int readings[] = {1, 2};
            printf("%f\\n", average(readings, 2));
            return 0;
        }
        """),
    "c_assign_in_condition": snippet("C", "should retry only requests that asked for a retry, but every request "
                                     "is retried, including successful ones", """
        #define STATUS_OK 0
        #define STATUS_RETRY 2

        int handle_status(int status) {
            if (status = STATUS_RETRY) {
                schedule_retry();
                return 1;
            }
            return 0;
        }
        """),
    "c_sizeof_pointer": snippet("C", "should zero a whole 256-byte line buffer, but only the first 8 bytes are "
                                "cleared and old text shows up after them", """
        #include <string.h>

        void clear_buffer(char *buf) {
            memset(buf, 0, sizeof(buf));
        }

        char line[256];
        /* ... */
        clear_buffer(line);
        """),
    "c_return_local_buffer": snippet("C", "should build a greeting, but the caller prints garbage characters, "
                                     "and the output changes depending on what else was called", """
        #include <stdio.h>

        const char *greeting(const char *name) {
            char buf[64];
            snprintf(buf, sizeof buf, "Hello, %s!", name);
            return buf;
        }
        """),
    "c_switch_fallthrough": snippet("C", "should label each log message with its level, but informational "
                                    "messages come out labelled WARN", """
        const char *level_name(int level) {
            const char *name = "UNKNOWN";
            switch (level) {
            case 1:
                name = "INFO";
            case 2:
                name = "WARN";
                break;
            case 3:
                name = "ERROR";
                break;
            }
            return name;
        }
        """),
    "cpp_erase_in_loop": snippet("C++", "should remove the negative numbers from a vector, but it crashes, or "
                                 "leaves a negative number behind when two of them are adjacent", """
        #include <vector>

        void drop_negatives(std::vector<int>& v) {
            for (auto it = v.begin(); it != v.end(); ++it) {
                if (*it < 0) {
                    v.erase(it);
                }
            }
        }
        """),
    "cpp_unsigned_countdown": snippet("C++", "should print a vector's elements in reverse, but after printing them "
                                      "it keeps going and crashes with a segmentation fault", """
        #include <cstdio>
        #include <vector>

        void print_reversed(const std::vector<int>& v) {
            for (std::size_t i = v.size() - 1; i >= 0; --i) {
                std::printf("%d\\n", v[i]);
            }
        }
        """),
    "cpp_dangling_view": snippet("C++", "should return a user's display name, but the caller sometimes prints "
                                 "garbage or an empty string", """
        #include <string>
        #include <string_view>

        std::string_view display_name(const std::string& first, const std::string& last) {
            std::string full = first + " " + last;
            return full;
        }
        """),
    # Go
    "go_race_counter": snippet("Go", "should count the words in all documents concurrently, but the total "
                               "differs from run to run and go test -race reports a data race", """
        func countWords(docs []string) int {
            total := 0
            var wg sync.WaitGroup
            for _, doc := range docs {
                wg.Add(1)
                go func(text string) {
                    defer wg.Done()
                    total += len(strings.Fields(text))
                }(doc)
            }
            wg.Wait()
            return total
        }
        """),
    "go_body_not_closed": snippet("Go", "is called every few seconds to check a service, and after some hours the "
                                  "process holds thousands of open connections and memory keeps growing", """
        func statusOf(url string) (int, error) {
            resp, err := http.Get(url)
            if err != nil {
                return 0, err
            }
            return resp.StatusCode, nil
        }
        """),
    "go_nil_map": snippet("Go", "should index items by tag, but the first call to Add panics with "
                          "\"assignment to entry in nil map\"", """
        type Index struct {
            byTag map[string][]int
        }

        func (ix *Index) Add(tag string, id int) {
            ix.byTag[tag] = append(ix.byTag[tag], id)
        }

        func main() {
            var ix Index
            ix.Add("urgent", 42)
        }
        """),
    "go_shadowed_err": snippet("Go", "should load a configuration file, but it always returns an empty Config "
                               "and no error, even for a valid file", """
        func loadConfig(path string) (Config, error) {
            var cfg Config
            data, err := os.ReadFile(path)
            if err == nil {
                cfg, err := parse(data)
                if err != nil {
                    return cfg, err
                }
            }
            return cfg, err
        }
        """),
    "go_defer_in_loop": snippet("Go", "should checksum every file in a directory, but on a directory of 20,000 "
                                "files it fails with \"too many open files\"", """
        func checksumAll(paths []string) (map[string]string, error) {
            sums := make(map[string]string)
            for _, p := range paths {
                f, err := os.Open(p)
                if err != nil {
                    return nil, err
                }
                defer f.Close()
                h := sha256.New()
                if _, err := io.Copy(h, f); err != nil {
                    return nil, err
                }
                sums[p] = hex.EncodeToString(h.Sum(nil))
            }
            return sums, nil
        }
        """),
    # Rust
    "rust_usize_underflow": snippet("Rust", "should return None when there is nothing to find, but called with an "
                                    "empty slice it panics with \"attempt to subtract with overflow\"", """
        fn last_below(v: &[i32], limit: i32) -> Option<usize> {
            let mut i = v.len() - 1;
            loop {
                if v[i] < limit {
                    return Some(i);
                }
                if i == 0 {
                    return None;
                }
                i -= 1;
            }
        }
        """),
    "rust_integer_ratio": snippet("Rust", "should return a hit rate in percent, but it returns 0.0 for every input "
                                  "except a perfect score, which gives 100.0", """
        fn hit_rate_percent(hits: u32, total: u32) -> f64 {
            (hits / total) as f64 * 100.0
        }
        """),
    "rust_shadowed_copy": snippet("Rust", "should cap every value at a maximum, but the vector comes back "
                                  "unchanged, and the compiler warns that a value is assigned but never read", """
        fn cap_all(values: &mut Vec<i32>, max: i32) {
            for v in values.iter() {
                let mut v = *v;
                if v > max {
                    v = max;
                }
            }
        }
        """),
    "rust_relock": snippet("Rust", "should keep at most 100 queued messages, but the very first call to push "
                           "never returns", """
        use std::sync::Mutex;

        struct Outbox {
            items: Mutex<Vec<String>>,
        }

        impl Outbox {
            fn len(&self) -> usize {
                self.items.lock().unwrap().len()
            }

            fn push(&self, message: String) {
                let mut items = self.items.lock().unwrap();
                if self.len() >= 100 {
                    items.remove(0);
                }
                items.push(message);
            }
        }
        """),
    # Java and C#
    "java_string_identity": snippet("Java", "should stop when the user types quit, but typing quit does nothing "
                                    "and the loop keeps asking for input", """
        Scanner in = new Scanner(System.in);
        boolean running = true;
        while (running) {
            String command = in.nextLine().trim();
            if (command == "quit") {
                running = false;
            } else {
                execute(command);
            }
        }
        """),
    "java_reader_not_closed": snippet("Java", "should count the lines of many log files, but a batch over 50,000 "
                                      "files fails part-way with \"Too many open files\"", """
        static long countLines(Path path) throws IOException {
            BufferedReader reader = Files.newBufferedReader(path);
            return reader.lines().count();
        }
        """),
    "java_int_overflow": snippet("Java", "should issue tokens that expire in 30 days, but every new token is "
                                 "already expired when it is issued", """
        static final int THIRTY_DAYS_MS = 30 * 24 * 60 * 60 * 1000;

        Token issue(String user) {
            long expiresAt = System.currentTimeMillis() + THIRTY_DAYS_MS;
            return new Token(user, expiresAt);
        }
        """),
    "java_equals_without_hashcode": snippet("Java", "should skip points it has already visited, but "
                                            "visited.contains(new Cell(1, 2)) is false right after "
                                            "visited.add(new Cell(1, 2))", """
        final class Cell {
            final int row, col;

            Cell(int row, int col) { this.row = row; this.col = col; }

            @Override
            public boolean equals(Object o) {
                if (!(o instanceof Cell)) return false;
                Cell c = (Cell) o;
                return row == c.row && col == c.col;
            }
        }

        Set<Cell> visited = new HashSet<>();
        """),
    "java_remove_in_foreach": snippet("Java", "should remove cancelled orders from a list, but it throws "
                                      "java.util.ConcurrentModificationException", """
        void dropCancelled(List<Order> orders) {
            for (Order order : orders) {
                if (order.isCancelled()) {
                    orders.remove(order);
                }
            }
        }
        """),
    "cs_missing_await": snippet("C#", "should save an order and then log it, but orders are sometimes missing from "
                                "the database although \"saved\" is logged, and the compiler shows warning CS4014",
                                """
        public async Task SaveAsync(Order order)
        {
            _db.Orders.Add(order);
            _db.SaveChangesAsync();
            _logger.LogInformation("saved order {Id}", order.Id);
        }
        """),
    # SQL
    "sql_wrong_join_column": snippet("SQL", "should show how much each customer has spent, but the totals make no "
                                     "sense and some customers with orders are missing", """
        SELECT c.name, SUM(o.total) AS spent
        FROM customers AS c
        JOIN orders AS o ON o.id = c.id
        GROUP BY c.name
        ORDER BY spent DESC;
        """),
    "sql_equals_null": snippet("SQL", "should count the support tickets that are still open, but it always "
                               "returns 0 although the queue is full", """
        SELECT COUNT(*) AS open_tickets
        FROM tickets
        WHERE closed_at = NULL;
        """),
    "sql_left_join_filter": snippet("SQL", "should list every product with its number of good reviews, but "
                                    "products without a good review are missing instead of showing 0", """
        SELECT p.title, COUNT(r.id) AS good_reviews
        FROM products AS p
        LEFT JOIN reviews AS r ON r.product_id = p.id
        WHERE r.stars >= 4
        GROUP BY p.title;
        """),
    "sql_integer_rate": snippet("SQL", "(PostgreSQL) should give each region's return rate in percent, but every "
                                "region shows 0", """
        -- returned is an integer column holding 0 or 1
        SELECT region,
               SUM(returned) / COUNT(*) * 100 AS return_rate_pct
        FROM sales
        GROUP BY region;
        """),
    "sql_between_timestamps": snippet("SQL", "should report March's orders, but orders placed during the day on "
                                      "31 March are missing from the report", """
        -- created_at is a TIMESTAMP column
        SELECT COUNT(*) AS orders, SUM(total) AS revenue
        FROM orders
        WHERE created_at BETWEEN '2024-03-01' AND '2024-03-31';
        """),
    # Bash
    "sh_unquoted_path": snippet("Bash", "should back up a folder, but it fails with \"cp: cannot stat "
                                "'/home/sam/Project': No such file or directory\"", """
        #!/bin/bash
        src="$HOME/Project Notes"
        dest="$1"
        mkdir -p "$dest"
        cp -r $src "$dest"
        echo "backed up to $dest"
        """),
    "sh_bracket_redirect": snippet("Bash", "should warn only when more than 10 jobs are queued, but it always "
                                   "warns, and a file named 10 keeps appearing in the working directory", """
        #!/bin/bash
        count=$(ls /var/spool/jobs | wc -l)
        if [ $count > 10 ]; then
            echo "warning: $count jobs queued" >&2
        fi
        """),
    "sh_pipe_subshell": snippet("Bash", "should add up the numbers in a file, but it always prints \"total: 0\"",
                                """
        #!/bin/bash
        total=0
        cat sizes.txt | while read -r n; do
            total=$((total + n))
        done
        echo "total: $total"
        """),
}

DEBUG_ASKS: dict[str, str] = {
    "junior": "Find the bug, explain it in plain words to a junior developer, and give the corrected code.",
    "minimal_fix": "Point to the faulty line, give a minimal fix, and write a regression test that fails before "
                   "the fix and passes after it.",
    "other_causes": "Find the bug and give the fixed code. Then list what else could cause the same symptom in a "
                    "larger program, and how you would tell those causes apart.",
    "review": "Write the code-review comment you would leave: what the bug is, why it happens, the fix, and how to "
              "avoid this kind of mistake in future.",
    "trace": "Trace the code step by step on a small input to show exactly where it goes wrong, then give the "
             "corrected version.",
}
DEBUG_FRAMES: dict[str, str] = {
    "production": "A bug report came in from production.",
    "pull_request": "I am reviewing a colleague's pull request.",
    "learning": "I am learning {language} and I am stuck.",
}
DEBUG_TEMPLATES: tuple[str, ...] = (
    "{frame} This {language} code {symptom}.\n\n```{fence}\n{code}\n```\n\n{ask}",
    "{frame} The {language} snippet below {symptom}.\n\n```{fence}\n{code}\n```\n\n{ask}",
)


def snippet_prompt(prompt_id: str, s: Snippet, ask: str, frame: str, templates: tuple[str, ...]) -> str:
    """A debugging request: ``frame`` (may name ``{language}``), the snippet with its symptom, then ``ask``, in the
    template of ``templates`` that ``prompt_id`` picks."""
    return pick_by_id(prompt_id, templates).format(
        frame=frame.format(language=s.language), language=s.language, symptom=s.symptom, fence=s.fence,
        code=s.code, ask=ask)


def debug_text(snippet: str, ask: str, frame: str) -> str:
    """The prompt for one snippet x ask x frame (keys of ``SNIPPETS``, ``DEBUG_ASKS``, ``DEBUG_FRAMES``)."""
    return snippet_prompt(f"worked_problems/debug/{snippet}/{ask}/{frame}", SNIPPETS[snippet], DEBUG_ASKS[ask],
                          DEBUG_FRAMES[frame], DEBUG_TEMPLATES)


# --- math -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MathTemplate:
    """A word problem with named ``fields``; each case gives their values, and ``valid`` (if set) says whether a
    case is well-posed."""

    fields: tuple[str, ...]
    text: str
    cases: tuple[tuple[Value, ...], ...]
    valid: Callable[..., bool] | None = None


def math_template(fields: str, text: str, cases: list[tuple[Value, ...]],
                  valid: Callable[..., bool] | None = None) -> MathTemplate:
    return MathTemplate(tuple(fields.split()), " ".join(text.split()), tuple(cases), valid)


def _ages_solvable(a: int, k: int, b: int, m: int) -> bool:
    """Whole, positive ages for "a years ago k times as old, in b years m times as old"."""
    numerator = (m - 1) * b + (k - 1) * a
    return k > m and numerator % (k - m) == 0 and numerator // (k - m) > a


MATH: dict[str, MathTemplate] = {
    "trains_meet": math_template("d v1 v2", """Two trains set off at the same moment from stations {d} km apart and head
        toward each other on parallel tracks, one at {v1} km/h and the other at {v2} km/h. After how long do they
        pass each other, and how far from the first station does that happen?""",
                         [(300, 80, 70), (450, 90, 60), (210, 65, 75), (520, 100, 130), (180, 50, 40),
                          (390, 85, 110)]),
    "catch_up": math_template("v1 v2 t", """A cyclist leaves a village riding at {v1} km/h. {t} minutes later a second
        cyclist sets off from the same spot along the same road at {v2} km/h. How long does the second cyclist
        ride before drawing level, and how far from the village are they then?""",
                      [(18, 24, 30), (15, 20, 40), (20, 28, 45), (12, 18, 20), (22, 30, 60), (16, 25, 36)],
                      lambda v1, v2, t: v2 > v1),
    "pumps_and_drain": math_template("a b c", """One pump can fill an empty cistern in {a} hours and a second pump can
        fill it in {b} hours, while an open drain would empty a full cistern in {c} hours. Starting from empty
        with both pumps running and the drain open, how long does it take to fill the cistern?""",
                             [(4, 6, 8), (3, 5, 10), (6, 9, 12), (2, 8, 4), (5, 10, 6), (8, 12, 16)],
                             lambda a, b, c: 1 / a + 1 / b > 1 / c),
    "painter_leaves": math_template("a b c", """Mira can paint a fence on her own in {a} hours and Tomas can paint it on
        his own in {b} hours. They start together, but Tomas leaves after {c} hours. How much longer does Mira
        need to finish, and how long does the whole job take?""",
                            [(6, 9, 2), (5, 8, 2), (10, 15, 3), (4, 12, 1.5), (8, 6, 2), (12, 18, 4)],
                            lambda a, b, c: c * (1 / a + 1 / b) < 1),
    "saline_mixture": math_template("p1 p2 v p", """A lab has a {p1}% salt solution and a {p2}% salt solution. How many
        litres of each must be combined to make {v} litres of a {p}% solution?""",
                            [(10, 30, 20, 15), (5, 25, 40, 12), (20, 50, 30, 32), (8, 20, 12, 15), (15, 40, 25, 25),
                             (2, 12, 50, 5)],
                            lambda p1, p2, v, p: p1 < p < p2),
    "discount_chain": math_template("price d1 d2 tax", """A coat is labelled {price} dollars. The shop takes {d1}% off,
        then the cashier applies a further {d2}% off the reduced price, and {tax}% sales tax is added at the end.
        What does the customer pay? What single percentage discount on the label price would have the same effect
        as the two discounts?""",
                            [(120, 25, 10, 8), (80, 30, 20, 6), (250, 15, 15, 10), (64, 50, 10, 5), (199, 20, 5, 7),
                             (45, 40, 25, 9)]),
    "price_rise_reversed": math_template("r new", """After a price increase of {r}%, a monthly train pass costs {new}
        dollars. What did it cost before the increase? If the new price is later cut by {r}%, is the pass back to
        its old price? Explain why or why not.""",
                                 [(25, 75), (20, 54), (10, 88), (12.5, 90), (40, 63), (8, 27)]),
    "compound_interest": math_template("r period p y", """A savings account pays {r}% a year, compounded {period}. If
        {p}
        dollars is deposited and nothing is withdrawn, how much will the account hold after {y} years, and after
        how many whole years will the balance first be at least double the deposit?""",
                               [(4, "monthly", 5000, 10), (6, "quarterly", 2000, 8), (3.5, "annually", 10000, 15),
                                (5, "monthly", 1200, 6), (7.2, "annually", 800, 10), (2.4, "quarterly", 25000, 12)]),
    "depreciation": math_template("p r y f", """A delivery van bought for {p} dollars loses {r}% of its value every
        year.
        What is it worth after {y} years, and in which year does its value first drop below {f} dollars?""",
                          [(40000, 15, 5, 10000), (28000, 20, 3, 5000), (60000, 12, 6, 20000), (15000, 25, 4, 2000),
                           (35000, 18, 5, 8000), (52000, 10, 8, 15000)],
                          lambda p, r, y, f: f < p),
    "marbles_same_colour": math_template("r b g", """A bag holds {r} red, {b} blue and {g} green marbles. Two marbles
        are
        taken out at random without putting the first back. What is the probability that both are the same
        colour? How does the answer change if the first marble is returned to the bag before the second is
        drawn?""",
                                 [(3, 4, 5), (5, 5, 2), (2, 6, 4), (4, 4, 4), (6, 3, 1), (7, 2, 3)]),
    "smoke_alarms": math_template("q n m", """Each smoke alarm in a building fails to go off during a fire with
        probability {q}%, independently of the others. With {n} alarms installed, what is the probability that
        at least one goes off? How many alarms are needed for the chance that every one of them fails to be below
        1 in {m}?""",
                          [(5, 2, 10000), (10, 3, 100000), (8, 2, 1000000), (15, 3, 100000), (3, 2, 1000000),
                           (20, 4, 1000000)]),
    "dice_sum": math_template("s t", """Two fair {s}-sided dice, numbered 1 to {s}, are rolled together. What is the
        probability that the two numbers add up to exactly {t}? What is the probability that they add up to {t}
        or more?""",
                      [(6, 7), (6, 9), (8, 9), (8, 12), (10, 11), (4, 6)],
                      lambda s, t: 2 <= t <= 2 * s),
    "fairground_game": math_template("c w6 w5", """A fairground game costs {c} dollars a turn. The player rolls one fair
        six-sided die: a six pays {w6} dollars, a five pays {w5} dollars, and any other roll pays nothing. What is
        the player's expected profit per turn? What would the payout for a six have to be for the game to be
        fair?""",
                             [(3, 12, 6), (2, 8, 3), (5, 20, 8), (1, 4, 2), (4, 15, 5), (10, 40, 15)]),
    "lawn_path": math_template("p l w c", """A gravel path {p} m wide runs all the way around the outside of a
        rectangular lawn measuring {l} m by {w} m. Gravel costs {c} dollars per square metre. How much does the
        gravel for the path cost, and what is the perimeter of the outer edge of the path?""",
                       [(1, 20, 12, 8), (1.5, 30, 18, 6), (2, 25, 25, 5), (0.8, 15, 10, 12), (1.2, 40, 22, 7),
                        (2.5, 18, 9, 4)]),
    "rain_barrel": math_template("h d", """An open-topped cylindrical rain barrel is {h} m tall with an inside
        diameter of
        {d} m. How many litres does it hold when full? How many square metres of sealant are needed to coat its
        inside wall and floor?""",
                         [(1.2, 0.6), (1, 0.8), (1.5, 0.9), (0.9, 0.5), (2, 1.2), (1.1, 0.7)]),
    "sliding_ladder": math_template("l d s", """A {l} m ladder leans against a vertical wall with its foot {d} m out
        from
        the base of the wall on level ground. How high up the wall does the top reach? If the foot slips a
        further {s} m away from the wall, how far does the top slide down?""",
                            [(5, 3, 1), (10, 6, 2), (13, 5, 7), (6.5, 2.5, 2), (8, 3, 2), (25, 7, 8)],
                            lambda l, d, s: d + s < l),
    "shadows": math_template("h s t s2", """At the same moment, a {h} m fence post casts a shadow {s} m long and a
        nearby
        tree casts a shadow {t} m long. How tall is the tree? Later in the afternoon the post's shadow has grown to
        {s2} m; how long is the tree's shadow then?""",
                     [(2, 1.5, 12, 2.5), (1.8, 2.4, 20, 3), (3, 2, 9, 4.5), (1.5, 0.9, 7.2, 1.2),
                      (2.4, 3.6, 15, 4.8), (1, 1.25, 10, 2)],
                     lambda h, s, t, s2: s2 > s),
    "fuel_economy": math_template("l dist", """A car uses {l} litres of fuel per 100 km. Convert this to miles per US
        gallon, using 1 mile = 1.609 km and 1 US gallon = 3.785 litres. How much fuel, in litres and in US
        gallons, does a {dist}-mile trip need?""",
                          [(6.5, 240), (8, 150), (5.2, 400), (9.8, 90), (4.7, 310), (7.4, 520)]),
    "running_pace": math_template("d m s", """A runner covers {d} km in {m} minutes and {s} seconds. What is the average
        pace in minutes and seconds per kilometre and per mile (1 mile = 1.609 km), and what is the average speed
        in km/h and in m/s?""",
                          [(10, 48, 30), (5, 27, 15), (21.1, 105, 0), (42.2, 214, 36), (3, 12, 45), (15, 71, 20)]),
    "mother_daughter_ages": math_template("a k b m", """{a} years ago, a mother was {k} times as old as her daughter. In
        {b} years' time she will be {m} times as old as her daughter. How old is each of them now?""",
                                  [(4, 6, 12, 2), (2, 6, 4, 3), (5, 3, 12, 2), (4, 6, 5, 3), (4, 3, 10, 2),
                                   (3, 3, 8, 2)],
                                  _ages_solvable),
    "committee": math_template("w men k x", """A club has {w} women and {men} men. In how many ways can a committee
        of {k}
        be chosen that includes at least {x} women? In how many of those committees do two particular women, who
        refuse to serve together, both appear?""",
                       [(6, 5, 4, 2), (7, 8, 5, 2), (5, 5, 3, 1), (8, 6, 4, 3), (4, 9, 5, 2), (10, 7, 6, 3)],
                       lambda w, men, k, x: 1 <= x <= min(k, w) and 2 <= k <= w + men and w >= 2),
    "letter_arrangements": math_template("word letter", """How many different arrangements are there of all the letters
        of the word {word}? In how many of them do the two copies of the letter {letter} stand side by side?""",
                                 [("BALLOON", "L"), ("LETTER", "T"), ("BANANA", "N"), ("COFFEE", "F"),
                                  ("PARALLEL", "A"), ("MISSISSIPPI", "P")],
                                 lambda word, letter: word.count(letter) == 2),
    "league_season": math_template("n k h f hours", """A league has {n} teams, and every team plays every other team {k}
        times. How many matches are there in a season? Each match needs a pitch for {h} hours, and {f} pitches
        are available for {hours} hours each week. At least how many weeks does the season take?""",
                           [(8, 2, 2, 3, 20), (10, 2, 1.5, 2, 30), (12, 1, 2, 2, 24), (6, 4, 2, 1, 16),
                            (16, 2, 1.5, 4, 40), (20, 2, 2, 5, 36)]),
    "two_presses": math_template("n a b h", """A print shop must produce {n} brochures. An older press prints {a}
        brochures an hour and a newer one prints {b} an hour. The older press starts alone, and the newer press
        joins it {h} hours later. How long after the start is the order finished, and how many brochures did
        each press print?""",
                         [(12000, 800, 1400, 3), (5000, 300, 500, 2), (20000, 1200, 2000, 4), (9000, 450, 900, 5),
                          (3600, 200, 400, 1.5), (15000, 1000, 1500, 6)],
                         lambda n, a, b, h: n > a * h),
    "boat_and_current": math_template("d t1 t2 d2", """A motorboat takes {t1} hours to travel {d} km upstream and {t2}
        hours to come back downstream. What is the boat's speed in still water, and how fast is the current? How
        long would a {d2} km trip take on a lake with no current?""",
                              [(24, 3, 2, 30), (36, 4, 3, 50), (30, 5, 3, 20), (48, 6, 4, 60), (60, 5, 4, 45),
                               (18, 3, 1.5, 27)],
                              lambda d, t1, t2, d2: t1 > t2),
    "test_average": math_template("n avg target top k", """A student's average over {n} tests is {avg}. What score on
        the
        next test would lift the average to exactly {target}? If every test is marked out of {top}, what is the
        highest average the student can reach after {k} more tests?""",
                          [(4, 72, 75, 100, 2), (5, 80, 82, 100, 3), (6, 65, 70, 100, 2), (3, 88, 90, 100, 1),
                           (8, 74, 76, 100, 4), (10, 81, 82, 100, 5)],
                          lambda n, avg, target, top, k: avg < target and target * (n + 1) - avg * n <= top),
    "course_grade": math_template("w1 w2 hw mid g g2", """A course grade is {w1}% homework, {w2}% midterm exam and
        the rest
        final exam. A student has {hw} on homework and {mid} on the midterm, both out of 100. What final exam
        score gives an overall grade of {g}? Is an overall grade of {g2} still possible?""",
                          [(20, 30, 90, 70, 80, 90), (25, 25, 85, 60, 75, 90), (30, 30, 95, 55, 80, 95),
                           (10, 40, 80, 70, 70, 85), (15, 35, 100, 65, 85, 95), (20, 40, 75, 80, 75, 88)],
                          lambda w1, w2, hw, mid, g, g2: w1 + w2 < 100
                          and 0 <= (100 * g - w1 * hw - w2 * mid) / (100 - w1 - w2) <= 100),
    "bacteria_doubling": math_template("d n h m d2", """A bacterial culture doubles every {d} minutes and starts with
        {n}
        cells. How many cells are there after {h} hours? How long does it take to reach {m} cells, and how much
        longer would that take if the doubling time were {d2} minutes instead?""",
                               [(20, 500, 3, 1000000, 30), (30, 1000, 4, 5000000, 45), (15, 200, 2, 10000000, 20),
                                (25, 50, 5, 2000000, 40), (40, 2000, 6, 100000000, 60), (18, 100, 2, 1000000, 24)],
                               lambda d, n, h, m, d2: d2 > d and m > n),
    "bakery_break_even": math_template("f c p target", """A small bakery has fixed costs of {f} dollars a month. Each
        loaf
        costs {c} dollars in ingredients and energy and sells for {p} dollars. How many loaves a month must it
        sell to break even? How many to make a monthly profit of {target} dollars? What price would lower the
        break-even number of loaves by a quarter?""",
                               [(3000, 1.2, 3.5, 2000), (4500, 0.9, 2.8, 1500), (2400, 1.5, 4, 1000),
                                (6000, 2, 5, 3000), (1800, 0.8, 2.6, 1200), (5200, 1.1, 3.2, 2500)],
                               lambda f, c, p, target: p > c),
    "simple_or_compound": math_template("p y s c", """Option A lends {p} dollars for {y} years at {s}% simple interest a
        year; option B lends the same amount for the same time at {c}% a year compounded annually. Which option
        costs the borrower less in total interest, and by how much?""",
                                [(10000, 5, 6, 5.5), (5000, 3, 8, 7.5), (20000, 10, 4, 3.5), (8000, 7, 5, 4.5),
                                 (15000, 4, 7, 6.8), (3000, 12, 3, 2.5)]),
    "clock_hands": math_template("h mm", """What is the smaller angle between the hour hand and the minute hand of an
        analogue clock at {h}:{mm}? At what time after that do the two hands next point in exactly the same
        direction?""",
                         [(3, 20), (7, 45), (10, 10), (2, 30), (8, 15), (11, 50)],
                         lambda h, mm: 1 <= h <= 12 and 10 <= mm <= 59),
    "round_trip_speed": math_template("d v1 v2", """A driver covers the {d} km to a coastal town at an average of
        {v1} km/h
        and drives back along the same road at {v2} km/h. What is the average speed for the whole round trip, and
        why is it not simply the mean of the two speeds?""",
                              [(120, 60, 90), (150, 100, 75), (90, 45, 90), (240, 80, 120), (60, 30, 60),
                               (200, 100, 50)],
                              lambda d, v1, v2: v1 != v2),
    "bicycle_survey": math_template("n a b c", """In a survey of {n} households, {a}% own a car. Of the car owners, {b}%
        also own a bicycle, and of the households without a car, {c}% own a bicycle. How many households own a
        bicycle, and what fraction of bicycle-owning households also own a car?""",
                            [(1200, 60, 35, 50), (800, 75, 20, 40), (2500, 40, 25, 55), (600, 55, 30, 45),
                             (1500, 80, 15, 60), (2000, 65, 40, 30)]),
    "screening_test": math_template("p s f n", """A condition affects {p}% of adults. A screening test detects it in
        {s}%
        of people who have it, but also flags {f}% of people who do not. If {n} adults are screened, how many
        positive results are expected, and what is the probability that a person with a positive result
        actually has the condition?""",
                            [(1, 95, 5, 10000), (0.5, 90, 2, 20000), (2, 99, 3, 5000), (5, 85, 10, 1000),
                             (0.2, 98, 1, 50000), (10, 80, 5, 2000)]),
    "growing_savings": math_template("a d n t", """Someone saves {a} dollars in the first month and then saves {d}
        dollars
        more each month than the month before. How much have they saved in total after {n} months, and in which
        month does the total first exceed {t} dollars?""",
                             [(50, 10, 12, 2000), (100, 5, 24, 5000), (20, 20, 10, 1500), (200, 25, 18, 8000),
                              (75, 15, 12, 3000), (10, 2, 36, 1500)]),
    "divisible_xor": math_template("n a b", """How many whole numbers from 1 to {n} are divisible by {a} or by {b} but
        not by both? How many are divisible by neither?""",
                              [(100, 3, 5), (500, 4, 6), (1000, 7, 11), (250, 6, 9), (360, 8, 12), (2000, 12, 15)]),
    "currency_round_trip": math_template("a r fee s r2", """A traveller changes {a} euros into dollars at {r} dollars
        per
        euro, and the exchange office keeps a {fee}% commission. She spends {s} dollars on the trip and changes
        the rest back at {r2} dollars per euro with the same commission. How many euros does she get back, and how
        many euros did the two exchanges cost her in commission?""",
                                 [(800, 1.1, 2, 500, 1.12), (1500, 1.08, 1.5, 1200, 1.1), (500, 1.12, 3, 300, 1.1),
                                  (2000, 1.05, 1, 1800, 1.07), (1200, 1.15, 2.5, 650, 1.13),
                                  (300, 1.09, 4, 150, 1.08)],
                                 lambda a, r, fee, s, r2: a * r * (1 - fee / 100) > s),
    "floor_tiles": math_template("l w t box waste", """A room measures {l} m by {w} m and is to be covered with square
        tiles {t} cm on a side. Tiles are sold in boxes of {box}, and {waste}% extra is bought to allow for
        cutting and breakage. How many boxes are needed, and how many tiles will be left over?""",
                         [(4, 3, 30, 10, 10), (5.4, 3.6, 60, 4, 8), (6, 4.5, 45, 8, 12), (3.2, 2.4, 20, 25, 10),
                          (7.5, 5, 50, 6, 5), (2.8, 2.1, 35, 12, 15)]),
}

MATH_ASKS: dict[str, str] = {
    "steps": "Solve it step by step, showing every calculation, and give the final answer on its own line.",
    "check": "Work it out step by step, then check the result with a second method or a quick sanity check.",
    "student": "Explain the solution step by step for a student who finds word problems hard: say what each "
               "quantity means before you calculate with it.",
    "model_first": "First write down the equations or formulas that model the problem, then solve them step by "
                   "step and say what the answer means in words.",
}


def check_math_case(source: str, name: str, template: MathTemplate, case: tuple[Value, ...]) -> None:
    """Refuse a case of ``template`` (called ``name`` in ``source``) with the wrong number of values, or one its
    ``valid`` check calls not well-posed."""
    if len(case) != len(template.fields):
        raise WorkloadError(f"{source}: math template {name!r} needs values for {list(template.fields)}, "
                            f"got {case!r}")
    if template.valid is not None and not template.valid(*case):
        raise WorkloadError(f"{source}: math template {name!r} case {case!r} is not a well-posed "
                            "problem (its check fails); fix or drop the case")


def math_text(template: str, case: tuple[Value, ...], ask: str) -> str:
    """The prompt for one case of a ``MATH`` template and a ``MATH_ASKS`` key."""
    t = MATH[template]
    check_math_case("worked_problems", template, t, case)
    problem = t.text.format(**{f: format_value(v) for f, v in zip(t.fields, case)})
    return f"{problem}\n\n{MATH_ASKS[ask]}"


# --- reasoning --------------------------------------------------------------------------------

Clue = tuple[Union[str, int], ...]


def _render(clues: tuple[Clue, ...], phrases: dict[str, str]) -> str:
    """Clues as sentences: ``(kind, arg, ...)`` -> ``phrases[kind]`` with ``{a}``, ``{b}``, ... set to the args
    (an entity key such as ``p1`` becomes the placeholder ``{p1}``, filled from the theme)."""
    sentences = []
    for kind, *args in clues:
        names = {k: (f"{{{v}}}" if isinstance(v, str) else str(v)) for k, v in zip("abcd", args)}
        sentences.append(phrases[kind].format(**names))
    return " ".join(sentences)


KNIGHT_STATEMENTS: dict[str, str] = {
    "x_is_T": "{x} is a {T}.", "y_is_T": "{y} is a {T}.", "z_is_T": "{z} is a {T}.",
    "x_is_F": "{x} is a {F}.", "y_is_F": "{y} is a {F}.", "z_is_F": "{z} is a {F}.",
    "y_z_same": "{y} and {z} are the same kind.",
    "at_least_one_F": "At least one of us three is a {F}.",
    "all_F": "All three of us are {Fs}.",
    "exactly_two_T": "Exactly two of us three are {Ts}.",
    "if_y_T_then_z_T": "If {y} is a {T}, then so is {z}.",
    "x_or_y_T": "At least one of {x} and {y} is a {T}.",
}
# What x, y and z say, in that order (each setup has exactly one consistent assignment).
KNIGHT_SETUPS: dict[str, tuple[str, str, str]] = {
    "s1": ("y_z_same", "z_is_F", "x_is_T"),
    "s2": ("z_is_T", "x_is_F", "at_least_one_F"),
    "s3": ("if_y_T_then_z_T", "all_F", "y_is_T"),
    "s4": ("y_is_F", "at_least_one_F", "x_is_F"),
    "s5": ("all_F", "exactly_two_T", "y_is_F"),
    "s6": ("exactly_two_T", "z_is_T", "x_or_y_T"),
}
KNIGHT_WORLDS: dict[str, Fills] = {
    "island": {"world": "On an island, every inhabitant is either a knight, who always tells the truth, or a "
                        "knave, who always lies.",
               "T": "knight", "F": "knave", "Ts": "knights", "Fs": "knaves", "x": "Ash", "y": "Briar", "z": "Cole"},
    "robots": {"world": "In a repair shop, every robot is either a Verifier, which only ever says true things, or a "
                        "Scrambler, which only ever says false things.",
               "T": "Verifier", "F": "Scrambler", "Ts": "Verifiers", "Fs": "Scramblers", "x": "Gizmo",
               "y": "Sprocket", "z": "Widget"},
    "club": {"world": "In a debating society, every member is either a Straight, who always tells the truth, or a "
                      "Twister, who always lies.",
             "T": "Straight", "F": "Twister", "Ts": "Straights", "Fs": "Twisters", "x": "Dara", "y": "Emeka",
             "z": "Fen"},
}

# Five entities p1..p5 in positions 1..5 (seats from the left, or finishing places); each setup has one solution.
POSITION_PHRASES_SEATING: dict[str, str] = {
    "at": "{a} is in {{unit}} {b}.", "left": "{a} is somewhere to the left of {b}.",
    "next": "{a} is directly next to {b}.", "not_next": "{a} is not next to {b}.",
    "gap1": "There is exactly one {{unit}} between {a} and {b}.", "end": "{a} is at one end of the row.",
    "not_end": "{a} is not at either end of the row.",
}
POSITION_PHRASES_RACE: dict[str, str] = {
    "at": "{a} finished in position {b}.", "left": "{a} finished ahead of {b}.",
    "next": "{a} and {b} finished in consecutive positions.",
    "not_next": "{a} and {b} did not finish in consecutive positions.",
    "gap1": "Exactly one competitor finished between {a} and {b}.", "end": "{a} finished either first or last.",
    "not_end": "{a} finished neither first nor last.",
}
SEATING_SETUPS: dict[str, tuple[Clue, ...]] = {
    "s1": (("end", "p1"), ("next", "p1", "p4"), ("left", "p2", "p4"), ("not_next", "p2", "p3"), ("at", "p3", 3)),
    "s2": (("not_end", "p2"), ("not_end", "p5"), ("next", "p2", "p5"), ("left", "p5", "p2"), ("gap1", "p1", "p2"),
           ("left", "p4", "p3"), ("next", "p1", "p4")),
    "s3": (("at", "p4", 2), ("not_next", "p1", "p4"), ("gap1", "p3", "p5"), ("left", "p5", "p3"), ("end", "p2"),
           ("left", "p2", "p1")),
    "s4": (("left", "p3", "p1"), ("left", "p1", "p5"), ("next", "p2", "p3"), ("not_end", "p5"), ("gap1", "p4", "p1"),
           ("not_next", "p2", "p4"), ("end", "p2")),
}
RACE_SETUPS: dict[str, tuple[Clue, ...]] = {
    "r1": (("at", "p2", 2), ("left", "p4", "p3"), ("next", "p3", "p5"), ("gap1", "p1", "p4"), ("not_end", "p5"),
           ("left", "p5", "p3"), ("end", "p4")),
    "r2": (("end", "p5"), ("left", "p1", "p5"), ("gap1", "p1", "p3"), ("left", "p3", "p1"), ("next", "p4", "p1"),
           ("not_end", "p2"), ("not_next", "p2", "p5")),
    "r3": (("not_end", "p1"), ("not_end", "p3"), ("not_end", "p4"), ("left", "p2", "p5"), ("next", "p1", "p5"),
           ("left", "p3", "p4")),
    "r4": (("left", "p4", "p2"), ("left", "p2", "p1"), ("gap1", "p3", "p4"), ("not_next", "p1", "p3"),
           ("end", "p3")),
}
SEATING_THEMES: dict[str, Fills] = {
    "cinema": {"intro": "Five friends, {p1}, {p2}, {p3}, {p4} and {p5}, sit in a row of five cinema seats numbered "
                        "1 to 5 from left to right.", "unit": "seat", "question": "Who sits in which seat?",
               "p1": "Alma", "p2": "Bertil", "p3": "Chioma", "p4": "Dev", "p5": "Elif"},
    "parking": {"intro": "Five neighbours, {p1}, {p2}, {p3}, {p4} and {p5}, park in a row of five spaces numbered "
                         "1 to 5 from left to right.", "unit": "space", "question": "Who parks in which space?",
                "p1": "Farah", "p2": "Gustav", "p3": "Hana", "p4": "Ivo", "p5": "Jun"},
    "spice_jars": {"intro": "Five spice jars, {p1}, {p2}, {p3}, {p4} and {p5}, stand on a shelf in five slots "
                            "numbered 1 to 5 from left to right.", "unit": "slot",
                   "question": "Which jar stands in which slot?",
                   "p1": "Basil", "p2": "Cumin", "p3": "Dill", "p4": "Fennel", "p5": "Ginger"},
}
RACE_THEMES: dict[str, Fills] = {
    "runners": {"intro": "Five runners, {p1}, {p2}, {p3}, {p4} and {p5}, ran a 1,500 m race, and there were no "
                         "ties.", "p1": "Kofi", "p2": "Lena", "p3": "Mateo", "p4": "Noor", "p5": "Otto"},
    "cyclists": {"intro": "Five cyclists, {p1}, {p2}, {p3}, {p4} and {p5}, rode a hill-climb time trial, and no "
                          "two recorded the same time.", "p1": "Pavla", "p2": "Quinn", "p3": "Rafa", "p4": "Sina",
                 "p5": "Tariq"},
    "swimmers": {"intro": "Five swimmers, {p1}, {p2}, {p3}, {p4} and {p5}, swam a 200 m final, and nobody "
                          "touched the wall at the same moment as anyone else.", "p1": "Uma", "p2": "Viggo",
                 "p3": "Wanda", "p4": "Xiu", "p5": "Yusuf"},
}

# Four people p1..p4, each with a different value a1..a4 of attribute A and b1..b4 of attribute B.
OWNERSHIP_PHRASES: dict[str, str] = {
    "pa": "{a}'s {{A}} is {b}.", "not_pa": "{a}'s {{A}} is not {b}.",
    "pb": "{a}'s {{B}} is {b}.", "not_pb": "{a}'s {{B}} is not {b}.",
    "ab": "The person whose {{A}} is {a} is the one whose {{B}} is {b}.",
    "not_ab": "The person whose {{A}} is {a} is not the one whose {{B}} is {b}.",
    "pa_or": "{a}'s {{A}} is either {b} or {c}.",
}
OWNERSHIP_SETUPS: dict[str, tuple[Clue, ...]] = {
    "o1": (("pa", "p4", "a2"), ("not_ab", "a1", "b3"), ("not_ab", "a4", "b4"), ("not_pa", "p1", "a3"),
           ("not_ab", "a1", "b2"), ("not_pb", "p2", "b1"), ("not_ab", "a3", "b2"), ("not_pb", "p2", "b4"),
           ("pa_or", "p1", "a3", "a4"), ("not_pb", "p3", "b4")),
    "o2": (("not_pb", "p1", "b2"), ("ab", "a1", "b1"), ("pa", "p3", "a3"), ("pa_or", "p2", "a1", "a4"),
           ("not_ab", "a4", "b3"), ("pa_or", "p1", "a3", "a4"), ("not_ab", "a2", "b2")),
    "o3": (("pa", "p1", "a4"), ("not_pa", "p4", "a2"), ("ab", "a2", "b4"), ("not_ab", "a1", "b3"),
           ("not_pb", "p4", "b3"), ("not_pa", "p2", "a2"), ("ab", "a4", "b1")),
}
OWNERSHIP_THEMES: dict[str, Fills] = {
    "pets_and_cars": {"group": "Four friends", "A": "pet", "B": "car", "p1": "Maya", "p2": "Jonas", "p3": "Priya",
                      "p4": "Leo", "a1": "a cat", "a2": "a dog", "a3": "a parrot", "a4": "a tortoise",
                      "b1": "red", "b2": "blue", "b3": "silver", "b4": "green"},
    "languages_and_cities": {"group": "Four developers", "A": "favourite language", "B": "home city", "p1": "Ines",
                             "p2": "Karl", "p3": "Wen", "p4": "Omar", "a1": "Go", "a2": "Rust", "a3": "Kotlin",
                             "a4": "Elixir", "b1": "Oslo", "b2": "Porto", "b3": "Kyoto", "b4": "Quito"},
    "instruments_and_sports": {"group": "Four students", "A": "instrument", "B": "sport", "p1": "Ada",
                               "p2": "Bruno", "p3": "Chidi", "p4": "Dana", "a1": "the cello", "a2": "the flute",
                               "a3": "the drums", "a4": "the piano", "b1": "rowing", "b2": "fencing", "b3": "judo",
                               "b4": "tennis"},
}

# Four suspects p1..p4, one culprit; each says one thing, and exactly one statement is true (or false).
SUSPECT_PHRASES: dict[str, str] = {
    "did": "{a} did it.", "didnt": "{a} did not do it.", "one_of": "It was either {a} or {b}.",
}
SUSPECT_SETUPS: dict[str, tuple[str, tuple[Clue, ...]]] = {
    "u1": ("one_true", (("did", "p2"), ("did", "p4"), ("one_of", "p1", "p4"), ("did", "p1"))),
    "u2": ("one_true", (("didnt", "p3"), ("one_of", "p1", "p3"), ("one_of", "p1", "p4"), ("did", "p2"))),
    "u3": ("one_false", (("didnt", "p3"), ("did", "p4"), ("didnt", "p2"), ("one_of", "p2", "p3"))),
    "u4": ("one_false", (("one_of", "p2", "p4"), ("didnt", "p3"), ("one_of", "p1", "p2"), ("did", "p3"))),
}
SUSPECT_MODES: dict[str, str] = {
    "one_true": "Exactly one of the four statements is true.",
    "one_false": "Exactly one of the four statements is false.",
}
SUSPECT_THEMES: dict[str, Fills] = {
    "milk": {"intro": "One of four flatmates, {p1}, {p2}, {p3} and {p4}, finished the milk and put the empty "
                      "carton back in the fridge.", "question": "Who finished the milk?",
             "p1": "Nia", "p2": "Oskar", "p3": "Pia", "p4": "Rafael"},
    "portrait": {"intro": "One of four pupils, {p1}, {p2}, {p3} and {p4}, drew a moustache on the portrait in the "
                          "school hall.", "question": "Who drew the moustache?",
                 "p1": "Sami", "p2": "Tilde", "p3": "Ugo", "p4": "Vera"},
    "parcel": {"intro": "One of four colleagues, {p1}, {p2}, {p3} and {p4}, opened a parcel addressed to someone "
                        "else.", "question": "Who opened the parcel?",
               "p1": "Wiebke", "p2": "Xander", "p3": "Yara", "p4": "Zoltan"},
}


def _suspect_setup(mode: str, statements: tuple[Clue, ...]) -> Fills:
    lines = [f"- {{p{i}}}: \"{_render((s,), SUSPECT_PHRASES)}\"" for i, s in enumerate(statements, 1)]
    return {"statements": "\n".join(lines), "mode": SUSPECT_MODES[mode]}


@dataclass(frozen=True)
class Puzzle:
    """A reasoning puzzle: ``text`` filled from one entry of each axis (``{key: {field: text}}``); a field's text
    may itself hold placeholders for fields of another axis (one level of nesting)."""

    text: str
    axes: tuple[dict[str, Fills], ...]


def _cases(fields: str, rows: list[tuple[Value, ...]]) -> dict[str, Fills]:
    """An axis of numeric cases keyed by their values."""
    names = fields.split()
    return {case_key(row): {f: format_value(v) for f, v in zip(names, row)} for row in rows}


def _schedule(item: str, rows: tuple[tuple[str, str], ...]) -> str:
    return "\n".join(f"- {item} {i}: {start} to {end}" for i, (start, end) in enumerate(rows, 1))


ROOM_SCHEDULES: dict[str, tuple[tuple[str, str], ...]] = {
    "morning": (("09:00", "10:30"), ("09:30", "11:00"), ("10:00", "10:45"), ("10:45", "12:00"), ("11:00", "12:30"),
                ("12:00", "13:00"), ("12:15", "13:30")),
    "afternoon": (("13:00", "14:00"), ("13:15", "15:00"), ("13:30", "14:15"), ("14:00", "16:00"),
                  ("14:15", "14:45"), ("15:00", "16:30"), ("15:30", "17:00"), ("16:00", "17:15")),
    "full_day": (("08:00", "12:00"), ("08:30", "09:30"), ("09:30", "11:00"), ("10:00", "13:00"), ("11:00", "12:30"),
                 ("12:00", "14:00"), ("13:00", "15:30"), ("14:00", "16:00")),
}
ROOM_THEMES: dict[str, Fills] = {
    "meetings": {"intro": "An office has to fit these meetings into its meeting rooms today:", "item": "Meeting",
                 "items": "meetings", "resources": "rooms"},
    "platforms": {"intro": "A small station has to give each of these trains a platform for the time it stands in "
                           "the station:", "item": "Train", "items": "trains", "resources": "platforms"},
    "theatres": {"intro": "A hospital has to schedule these operations in its operating theatres:",
                 "item": "Operation", "items": "operations", "resources": "theatres"},
}

# Six tasks T1..T6: (duration, prerequisites).
TASK_GRAPHS: dict[str, tuple[tuple[int, tuple[int, ...]], ...]] = {
    "g1": ((3, ()), (2, (1,)), (4, (1,)), (1, (2,)), (3, (3, 4)), (2, (5,))),
    "g2": ((2, ()), (5, ()), (3, (1,)), (2, (1, 2)), (4, (3,)), (1, (4, 5))),
    "g3": ((4, ()), (1, (1,)), (2, (1,)), (6, ()), (3, (2, 3)), (2, (4, 5))),
}
TASK_THEMES: dict[str, tuple[str, str, int, tuple[str, ...]]] = {
    "renovation": ("A kitchen renovation is planned as six tasks.", "days", 1,
                   ("strip out the old units", "rewire the sockets", "re-plumb the sink", "plaster the walls",
                    "fit the new units", "tile the splashback")),
    "launch": ("A small team is preparing a product launch as six tasks.", "days", 1,
               ("write the copy", "shoot the photos", "build the landing page", "set up the payment page",
                "brief the support team", "send the announcement")),
    "dinner": ("Cooking dinner for friends involves six tasks.", "minutes", 10,
               ("chop the vegetables", "make the stock", "roast the squash", "cook the risotto", "bake the tart",
                "set the table")),
}


def _task_list(graph: str, theme: str) -> Fills:
    intro, unit, scale, names = TASK_THEMES[theme]
    lines = []
    for i, (duration, needs) in enumerate(TASK_GRAPHS[graph]):
        after = ", ".join(f"T{j}" for j in needs) if needs else "nothing"
        amount = duration * scale
        lines.append(f"- T{i + 1}, {names[i]}: {amount} {unit if amount != 1 else unit[:-1]}, waits for {after}")
    return {"intro": intro, "tasks": "\n".join(lines), "unit": unit}


WASON: dict[str, Fills] = {
    "letters_a": {"setup": "Each card has a letter on one side and a number on the other. The rule is: \"If a card "
                           "has a vowel on one side, it has an even number on the other side.\" The visible faces "
                           "are E, K, 4 and 7."},
    "letters_b": {"setup": "Each card has a letter on one side and a number on the other. The rule is: \"If a card "
                           "shows a consonant, its other side is an odd number.\" The visible faces are A, T, 2, 9 "
                           "and R."},
    "drinks_a": {"setup": "Each card describes a customer at a bar, with their drink on one side and their age on "
                          "the other. The rule is: \"Anyone drinking beer is at least 18.\" The visible faces are "
                          "beer, cola, 25 and 16."},
    "drinks_b": {"setup": "Each card describes a customer at a bar, with their drink on one side and their age on "
                          "the other. The rule is: \"Anyone drinking wine is at least 18.\" The visible faces are "
                          "juice, wine, 17, 40 and wine."},
    "trips_a": {"setup": "Each card records a business trip, with the destination on one side and the transport "
                         "on the other. The rule is: \"Every trip to Lyon was made by train.\" The visible faces "
                         "are Lyon, Bern, train and car."},
    "trips_b": {"setup": "Each card records a business trip, with the destination on one side and the transport "
                         "on the other. The rule is: \"Every trip made by plane went to Nice.\" The visible faces "
                         "are Nice, Lyon, plane and train."},
    "shapes_a": {"setup": "Each card has a shape on one side and a colour on the other. The rule is: \"If a card "
                          "shows a triangle, its other side is green.\" The visible faces are triangle, circle, "
                          "green and red."},
    "shapes_b": {"setup": "Each card has a shape on one side and a colour on the other. The rule is: \"Every blue "
                          "card has a square on its other side.\" The visible faces are square, triangle, blue, "
                          "green and red."},
}

FERMI_QUANTITIES: dict[str, Fills] = {
    "coffee": {"quantity": "how many cups of coffee are drunk in {place} on an ordinary weekday"},
    "pizza": {"quantity": "how many pizzas are delivered in {place} on a Friday evening"},
    "bike_tyres": {"quantity": "how many bicycle tyres are replaced in {place} in a year"},
    "shower_water": {"quantity": "how many litres of water go into showers in {place} in one day"},
}
FERMI_PLACES: dict[str, Fills] = {
    "city": {"place": "a city of one million people"},
    "campus": {"place": "a university campus with 20,000 students"},
    "office_district": {"place": "an office district where 50,000 people work"},
}

RIVER_CASTS: dict[str, Fills] = {
    "dog_cat_canary": {"keeper": "pet sitter", "items": "a dog, a cat and a caged canary",
                       "rules": "the dog would chase the cat, and the cat would go after the canary."},
    "owl_mouse_grain": {"keeper": "farmer", "items": "an owl, a mouse and a sack of grain",
                        "rules": "the owl would eat the mouse, and the mouse would eat the grain."},
    "ferret_rabbit_lettuce": {"keeper": "gardener", "items": "a ferret, a rabbit and a crate of lettuce",
                              "rules": "the ferret would attack the rabbit, and the rabbit would eat the lettuce."},
}
RIVER_BOATS: dict[str, Fills] = {
    "one_seat": {"boat": "The boat only has room for the {keeper} and one of the three."},
    "two_seats": {"boat": "The boat has room for the {keeper} and any two of the three."},
}

PUZZLES: dict[str, Puzzle] = {
    "knights_and_knaves": Puzzle(
        "{world} You meet three of them: {x}, {y} and {z}. {x} says: \"{s0}\" {y} says: \"{s1}\" {z} says: \"{s2}\" "
        "Which of them are {Ts} and which are {Fs}?",
        ({k: {f"s{i}": KNIGHT_STATEMENTS[s] for i, s in enumerate(v)} for k, v in KNIGHT_SETUPS.items()},
         KNIGHT_WORLDS)),
    "seating": Puzzle("{intro} {clues} {question}",
                      ({k: {"clues": _render(v, POSITION_PHRASES_SEATING)} for k, v in SEATING_SETUPS.items()},
                       SEATING_THEMES)),
    "finishing_order": Puzzle("{intro} {clues} What was the finishing order?",
                              ({k: {"clues": _render(v, POSITION_PHRASES_RACE)} for k, v in RACE_SETUPS.items()},
                               RACE_THEMES)),
    "who_has_what": Puzzle(
        "{group}, {p1}, {p2}, {p3} and {p4}, each have a different {A} ({a1}, {a2}, {a3} or {a4}) and a different "
        "{B} ({b1}, {b2}, {b3} or {b4}). {clues} Work out each person's {A} and {B}.",
        ({k: {"clues": _render(v, OWNERSHIP_PHRASES)} for k, v in OWNERSHIP_SETUPS.items()}, OWNERSHIP_THEMES)),
    "one_culprit": Puzzle("{intro} Each of them makes one statement:\n{statements}\n{mode} {question}",
                          ({k: _suspect_setup(*v) for k, v in SUSPECT_SETUPS.items()}, SUSPECT_THEMES)),
    "river_crossing": Puzzle(
        "A {keeper} must get {items} across a river in a small boat, and only the {keeper} can row. {boat} Left "
        "alone without the {keeper}, {rules} What is the shortest plan that gets all three "
        "across safely, and how many crossings does it take?", (RIVER_CASTS, RIVER_BOATS)),
    "measuring_jugs": Puzzle(
        "You have an unmarked {a}-litre jug, an unmarked {b}-litre jug, a tap and a drain. How can you end up with "
        "exactly {c} litres in one of the jugs, using as few pourings as possible? If it cannot be done, prove it.",
        (_cases("a b c", [(3, 5, 4), (4, 9, 6), (5, 7, 6), (7, 10, 2), (6, 9, 4), (8, 11, 5), (5, 13, 9),
                          (4, 10, 7)]),)),
    "counterfeit_coin": Puzzle(
        "Among {n} identical-looking coins, exactly one is counterfeit, and it is slightly {direction} than the "
        "others. Using only a two-pan balance, what is the smallest number of weighings that always finds the "
        "counterfeit? Give a strategy that achieves it and explain why fewer weighings cannot be enough.",
        (_cases("n", [(8,), (9,), (10,), (20,), (27,), (50,)]),
         {"lighter": {"direction": "lighter"}, "heavier": {"direction": "heavier"}})),
    "fermi_estimate": Puzzle(
        "Estimate {quantity}. Give every assumption a number, and end with a plausible range rather than a single "
        "figure.", (FERMI_QUANTITIES, FERMI_PLACES)),
    "locker_toggles": Puzzle(
        "A corridor has {n} lockers, all closed. {m} pupils walk past one after another: pupil 1 opens every "
        "locker, pupil 2 toggles every 2nd locker, pupil 3 toggles every 3rd locker, and so on, where toggling "
        "means opening a closed locker or closing an open one. Which lockers are open after the last pupil has "
        "passed, and how many are there?",
        (_cases("n m", [(100, 100), (50, 50), (200, 200), (30, 30), (100, 10), (64, 8)]),)),
    "socks_in_the_dark": Puzzle(
        "A drawer holds {r} red, {b} blue and {k} black socks, all mixed together, and the room is dark. How many "
        "socks must you take out to be certain of {goal}?",
        (_cases("r b k", [(6, 4, 10), (3, 8, 5), (12, 2, 7)]),
         {"any_pair": {"goal": "having at least one matching pair"},
          "black_pair": {"goal": "having a pair of black socks"},
          "two_pairs": {"goal": "having two matching pairs (the two pairs may be the same colour)"}})),
    "unpayable_amounts": Puzzle(
        "{context} What is the largest amount that cannot be made exactly, and which amounts cannot be made at all?",
        (_cases("a b", [(3, 5), (4, 7), (5, 8), (6, 11), (7, 9), (5, 12)]),
         {"coins": {"context": "A country mints only {a}-cent and {b}-cent coins, and shops never give change. "
                               "Amounts are in whole cents."},
          "packs": {"context": "A shop sells party balloons only in packs of {a} and packs of {b}. Amounts are "
                               "numbers of balloons."}})),
    "tournament_matches": Puzzle(
        "{n} players enter a tournament. {format}",
        (_cases("n", [(13,), (20,), (37,), (50,), (64,), (100,)]),
         {"knockout": {"format": "It is a knockout: a player is eliminated after one loss, and when a round has an "
                                 "odd number of players one of them gets a bye to the next round. How many matches "
                                 "are played in total, how many rounds are needed, and how many byes are given?"},
          "double_elimination": {"format": "It is a double-elimination event: a player is out after their second "
                                           "loss. How many matches are played if the eventual champion never loses, "
                                           "and how many if the champion loses once?"}})),
    "rooms_needed": Puzzle(
        "{intro}\n{schedule}\nWhat is the smallest number of {resources} needed so that no two {items} overlap in "
        "the same one, and which assignment achieves it? Something that ends at the moment another starts does not "
        "overlap it.",
        ({k: {"schedule": _schedule("{item}", v)} for k, v in ROOM_SCHEDULES.items()}, ROOM_THEMES)),
    "critical_path": Puzzle(
        "{intro} The tasks, how long each takes and what each must wait for are:\n{tasks}\nIf enough people are "
        "available to work on any number of tasks at once, what is the shortest time to finish everything, and "
        "which tasks have no slack? How long does it take if only two people are available, each working on one "
        "task at a time?",
        ({f"{g}/{t}": _task_list(g, t) for g, t in product(TASK_GRAPHS, TASK_THEMES)},)),
    "card_rule": Puzzle(
        "{setup} Which cards must be turned over to find out whether the rule holds for these cards, and why is "
        "turning any other card unnecessary?", (WASON,)),
    "next_terms": Puzzle(
        "What are the next two terms of the sequence {seq}, ...? Describe the rule in words and as a formula (for "
        "the n-th term, or from the previous terms), and check it against every given term.",
        ({k: {"seq": v} for k, v in {
            "pronic": "2, 6, 12, 20, 30, 42", "sum_of_two": "3, 4, 7, 11, 18, 29", "double_plus_one": "1, 3, 7, 15, 31",
            "double_minus_one": "2, 3, 5, 9, 17, 33", "double_plus_two": "1, 4, 10, 22, 46",
            "shrinking": "100, 96, 88, 76, 60", "factorials": "1, 2, 6, 24, 120", "growing_gaps": "5, 9, 17, 29, 45",
            "cubes": "1, 8, 27, 64, 125", "times_one_and_a_half": "64, 96, 144, 216"}.items()},)),
    "weekday_arithmetic": Puzzle(
        "Today is a {day}. What day of the week will it be {n} days from today, and what day of the week was it {m} "
        "days ago? How many Saturdays and Sundays fall within the next {n} days, not counting today?",
        (_cases("day n m", [("Tuesday", 100, 45), ("Saturday", 365, 1000), ("Monday", 250, 73),
                            ("Thursday", 1000, 366), ("Sunday", 59, 200), ("Wednesday", 777, 84),
                            ("Friday", 400, 31), ("Monday", 2024, 10)]),)),
    "time_zones": Puzzle(
        "A flight leaves {c1} ({o1}) at {dep} local time and is in the air for {dur}. What is the local time in "
        "{c2} ({o2}) when it lands, and is that the same calendar day as the departure? The return flight leaves "
        "{c2} at {ret} local time and takes {dur2}; when does it land in {c1}, local time?",
        ({k: dict(zip(("c1", "o1", "dep", "dur", "c2", "o2", "ret", "dur2"), v)) for k, v in {
            "lisbon_tokyo": ("Lisbon", "UTC+0", "22:40", "11 h 50 min", "Tokyo", "UTC+9", "10:15", "14 h 30 min"),
            "toronto_madrid": ("Toronto", "UTC-5", "19:05", "7 h 20 min", "Madrid", "UTC+1", "12:30", "8 h 45 min"),
            "auckland_san_francisco": ("Auckland", "UTC+13", "21:00", "12 h 55 min", "San Francisco", "UTC-8",
                                       "22:30", "13 h 40 min"),
            "dubai_sao_paulo": ("Dubai", "UTC+4", "02:35", "13 h 10 min", "Sao Paulo", "UTC-3", "01:20",
                                "14 h 5 min"),
            "mumbai_london": ("Mumbai", "UTC+5:30", "23:50", "9 h 25 min", "London", "UTC+0", "09:10", "8 h 55 min"),
            "honolulu_sydney": ("Honolulu", "UTC-10", "15:45", "10 h 10 min", "Sydney", "UTC+11", "11:00",
                                "9 h 35 min"),
            "nairobi_kathmandu": ("Nairobi", "UTC+3", "08:20", "6 h 15 min", "Kathmandu", "UTC+5:45", "17:40",
                                  "6 h 30 min"),
            "reykjavik_new_york": ("Reykjavik", "UTC+0", "16:30", "5 h 40 min", "New York", "UTC-5", "20:55",
                                   "5 h 50 min")}.items()},)),
    "three_languages": Puzzle(
        "In a group of {n} students, {f} study French, {s} study Spanish and {g} study German. The numbers "
        "studying two of them are {fs} for French and Spanish, {fg} for French and German and {sg} for Spanish and "
        "German (each count includes anyone studying all three), and the number studying all three is {fsg}. How many "
        "study none of the three languages, and how many study exactly one?",
        (_cases("n f s g fs fg sg fsg", [(40, 20, 16, 11, 5, 4, 3, 1), (70, 34, 28, 22, 9, 8, 7, 3),
                                         (40, 15, 21, 15, 5, 4, 7, 2), (100, 44, 38, 29, 13, 10, 11, 4),
                                         (40, 12, 13, 17, 3, 5, 4, 1), (120, 54, 44, 33, 16, 13, 11, 5),
                                         (60, 29, 16, 23, 8, 10, 5, 3), (40, 18, 24, 10, 8, 3, 5, 2)]),)),
    "grid_routes": Puzzle(
        "A town's streets form a square grid. Put the start at the crossing (0, 0), with the first coordinate "
        "counting blocks east and the second counting blocks north. Walking only east or north along the streets, "
        "how many shortest routes lead from (0, 0) to ({e}, {n})? How many of those routes avoid the crossing "
        "({e1}, {n1}), which is closed for repairs?",
        (_cases("e n e1 n1", [(4, 3, 2, 1), (5, 5, 2, 2), (6, 4, 3, 2), (3, 3, 1, 1), (7, 3, 4, 1), (5, 4, 1, 3),
                              (6, 6, 3, 3), (8, 2, 5, 1)]),)),
    "number_guessing": Puzzle(
        "A friend picks a whole number from 1 to {n}. You may ask questions that can only be answered yes or no. "
        "What is the smallest number of questions that guarantees you can name the number, and which questions "
        "achieve it? How many guesses do you need instead if each guess is answered only with higher, lower or "
        "correct, and the last guess must be correct?",
        (_cases("n", [(100,), (1000,), (500,), (64,), (2000,), (30,)]),)),
}

REASONING_ASKS: dict[str, str] = {
    "steps": "Reason through it step by step, justifying each step, and state the final answer clearly at the end.",
    "facts_first": "Start by listing the facts and constraints you are given, then work from them one step at a "
                   "time, and finish with a short summary of the answer.",
    "pitfall": "Work through it step by step, and point out the step where a hasty solver would most likely go "
               "wrong.",
    "newcomer": "Explain your reasoning so that someone who has never met this kind of problem could follow every "
                "step, then give the answer.",
}


def reasoning_text(puzzle: str, keys: tuple[str, ...], ask: str) -> str:
    """The prompt for one puzzle of ``PUZZLES``, one key per axis, and a ``REASONING_ASKS`` key."""
    p = PUZZLES[puzzle]
    if len(keys) != len(p.axes):
        raise WorkloadError(f"worked_problems: puzzle {puzzle!r} has {len(p.axes)} axes, got keys {list(keys)}")
    fills: Fills = {}
    for axis, key in zip(p.axes, keys):
        fills.update(axis[key])
    resolved = {field: value.format_map(fills) for field, value in fills.items()}
    return f"{p.text.format_map(resolved)}\n\n{REASONING_ASKS[ask]}"


# --- the source -------------------------------------------------------------------------------

CATEGORIES = ("debug", "math", "reasoning")


def _debug_items() -> list[tuple[str, str]]:
    return [(f"{s}/{a}/{f}", debug_text(s, a, f)) for s, a, f in product(SNIPPETS, DEBUG_ASKS, DEBUG_FRAMES)]


def _math_items() -> list[tuple[str, str]]:
    return [(f"{name}/{case_key(case)}/{ask}", math_text(name, case, ask))
            for name, template in MATH.items() for case in template.cases for ask in MATH_ASKS]


def _reasoning_items() -> list[tuple[str, str]]:
    return [(f"{name}/{'/'.join(keys)}/{ask}", reasoning_text(name, keys, ask))
            for name, puzzle in PUZZLES.items() for keys in product(*puzzle.axes) for ask in REASONING_ASKS]


def category_items(category: str) -> list[tuple[str, str]]:
    """(id below ``worked_problems/<category>/``, prompt text) for every prompt of one category."""
    builders = {"debug": _debug_items, "math": _math_items, "reasoning": _reasoning_items}
    if category not in builders:
        raise WorkloadError(f"worked_problems: unknown category {category!r}; allowed: {list(CATEGORIES)}")
    return builders[category]()


class WorkedProblemsWorkload(Workload):
    """Every snippet x ask x frame (debug), case x ask (math) and setup x theme x ask (reasoning) as one request."""

    NAME = "worked_problems"

    def load_pool(self) -> list[Prompt]:
        refuse_path("worked_problems", self.spec.path, "'custom' with path= for a prompt file")
        return [user_turn_prompt(f"worked_problems/{category}/{key}", text, f"worked_problems:{category}")
                for category in CATEGORIES for key, text in category_items(category)]


__all__ = ["CATEGORIES", "DEBUG_ASKS", "DEBUG_FRAMES", "DEBUG_TEMPLATES", "FENCES", "MATH", "MATH_ASKS", "PUZZLES",
           "REASONING_ASKS", "SNIPPETS", "Snippet", "WorkedProblemsWorkload", "category_items", "check_math_case",
           "debug_text", "math_text", "reasoning_text", "snippet", "snippet_prompt"]
