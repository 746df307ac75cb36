# Flow control from the shell: limits, pause and resume (the output is shown on limits.md).
delayq offer reports '{"report": 1}' --delay 0 --limit-key tenant:acme
delayq limits set reports tenant:acme --rate 10 --per 1m --concurrency 2
delayq limits set reports '~default' --concurrency 1
delayq limits list reports
delayq pause reports --until 30m --note "warehouse migration"
delayq stats reports
delayq resume reports
