"""Hand-written continuation scenarios shaped like real agent work: ``python
examples/handwritten.py`` writes ``examples/handwritten_dev.jsonl`` and
``examples/handwritten_test.jsonl``.

Four small projects, written by hand (not templated): two form the dev half (the ranking was
tuned on it), two the test half (looked at once, after the choices were made). In each:

- the relevant memory paraphrases the next action, or is linked to it only through a person
  named in the facts, an open question or a constraint;
- distractors share the next action's words;
- "go on" requests come in several languages and with filler words ("weiter", "jatka",
  "vale, sigue por favor", "ok, next step please");
- a self-contained question asked while another task is in flight, and a topic switch, check
  that the task context costs nothing when the request says what it needs.

Relevance grades: 2 needed for the next action, 1 useful.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def corpus(name: str, principal: str, scope: str, memories: dict[str, str]) -> dict[str, Any]:
    return {"corpus": name, "memories": [
        {"id": key, "text": text, "principal": principal, "scope": scope}
        for key, text in memories.items()]}


def scenario(sid: str, family: str, principal: str, scope: str, corpus_name: str,
             state: dict[str, Any], relevant: dict[str, int]) -> dict[str, Any]:
    state = {"tasks": [{"text": state["next_action"], "done": False}], **state} if (
        "next_action" in state and "tasks" not in state) else state
    return {"id": sid, "family": family, "principal": principal, "scope": scope,
            "corpus": corpus_name, "state": state, "relevant": relevant}


# -- dev half ------------------------------------------------------------------------------------

PAY = corpus("payments", "maya", "payments", {
    "a01": "Stripe signs every webhook payload; the signing secret lives in Vault under "
           "payments/stripe-whsec.",
    "a02": "Incoming payment notifications must be verified with the HMAC header before we "
           "trust them; the old handler skipped this.",
    "a03": "Webhook retry storm on 12 May: Stripe retried 40k events after our endpoint "
           "returned 500s.",
    "a04": "The webhook dashboard moved to the Grafana folder Payments/Webhooks.",
    "a05": "Notification emails for failed payments are sent by the mailer service.",
    "a06": "Idempotency: store each event id in processed_events and drop duplicates.",
    "a07": "Priya from finance owns the reconciliation report and wants refunds split by "
           "currency.",
    "a08": "Refund exports go to the finance bucket every night at 01:00.",
    "a09": "Reconciliation report v2 draft: add a column for partial refunds.",
    "a10": "Deploys to payments are frozen during month-end close (the last two business "
           "days).",
    "a11": "The checkout page shows a spinner while the payment intent is created.",
    "a12": "Check the signature on release tags before publishing the SDK.",
    "a13": "Marco from security asked that secrets never appear in logs, webhook secrets in "
           "debug output included.",
    "a14": "The payments service logs at INFO in production; DEBUG is only enabled in "
           "staging.",
    "a15": "Open decision: replay missed events from the Stripe dashboard or from our own "
           "event log?",
    "a16": "Our event log keeps 30 days of raw bodies in the events_raw table.",
    "a17": "Stripe's dashboard can resend an event for up to 3 days after it was created.",
    "a18": "Team lunch on Friday at the Thai place.",
    "a19": "Payment notifications to customers are translated into six languages.",
    "a20": "Verifying signatures adds about 0.3 ms per request in the load test.",
    "a21": "Currency conversion uses the ECB rate of the previous business day.",
    "a22": "Priya is on leave until the 20th; Jonas covers finance questions meanwhile.",
    "a23": "Incoming notifications from the bank are parsed by the camt053 importer.",
    "a24": "Run the replay of the checkout A/B test results on Monday.",
})

MOB = corpus("mobile", "tom", "mobile", {
    "b01": "App Store review rejected 4.2: the privacy manifest lacked the tracking domains.",
    "b02": "Privacy manifest: list every tracking domain under NSPrivacyTrackingDomains.",
    "b03": "The 4.2 release notes draft is in the shared drive under Mobile/Release notes.",
    "b04": "Crash-free sessions dropped to 97.1% after 4.1 on Android 14 devices.",
    "b05": "On Android 14 the media chooser throws SecurityException without "
           "READ_MEDIA_VISUAL_USER_SELECTED.",
    "b06": "Ana, the QA lead, wants a full regression pass on the three oldest supported "
           "iPhones before any release.",
    "b07": "Oldest supported iPhones: SE 2nd gen, 11 and XR; the devices are in the QA "
           "cabinet.",
    "b08": "Release trains leave every second Tuesday; a missed train waits two weeks.",
    "b09": "Support is thin on weekends, so nothing goes out on a Friday.",
    "b10": "The review of the onboarding redesign is on Thursday.",
    "b11": "Store images must be redone for every new device size Apple adds.",
    "b12": "Feature flag dark_mode_v2 is on for 10% of users.",
    "b13": "Marketing asked whether the in-app banner can point to the spring campaign.",
    "b14": "Deep links to campaigns use the /promo/<slug> route; the slug is set in the CMS.",
    "b15": "Release checklist: bump the build number in both the iOS and Android projects.",
    "b16": "Photo uploads are compressed to 80% JPEG quality on the device.",
    "b17": "The Android build uses Gradle 8.7; 8.9 is blocked on a plugin.",
    "b18": "A new build submitted for review waits about 24 hours before Apple looks at it.",
    "b19": "Crash reports are grouped in Sentry by release and device model.",
    "b20": "The coffee machine on floor 2 is broken again.",
    "b21": "Fix the photo picker layout on small screens (design ticket MOB-311).",
    "b22": "Apple rejected the marketing team's expense report template.",
})

DEV = [PAY, MOB,
    scenario("hd-01", "continuation", "maya", "payments", "payments", {
        "current_request": "weiter",
        "next_action": "Make sure we only trust payment notifications that Stripe really sent",
        "objective": "Harden the payments webhook endpoint"},
        {"a01": 2, "a02": 2, "a20": 1}),
    scenario("hd-02", "continuation", "maya", "payments", "payments", {
        "current_request": "ok, next step please",
        "next_action": "Write the replay job",
        "open_questions": ["Replay from the Stripe dashboard or from our own event log?"],
        "objective": "Recover the events lost in the May outage"},
        {"a16": 2, "a17": 2, "a15": 1}),
    scenario("hd-03", "continuation", "maya", "payments", "payments", {
        "current_request": "Continue",
        "next_action": "Prepare the numbers she asked for",
        "facts": [{"text": "Priya asked for the refund numbers", "entities": ["Priya"]}]},
        {"a07": 2, "a09": 2, "a22": 1}),
    scenario("hd-04", "continuation", "maya", "payments", "payments", {
        "current_request": "go on",
        "next_action": "Turn on verbose output for the webhook handler to debug the failures",
        "constraints": ["Never expose secrets"]},
        {"a13": 2, "a14": 2}),
    scenario("hd-05", "self_contained_in_flight", "maya", "payments", "payments", {
        "current_request": "When are deploys to payments frozen?",
        "next_action": "Make sure we only trust payment notifications that Stripe really sent"},
        {"a10": 2}),
    scenario("hd-06", "topic_switch", "maya", "payments", "payments", {
        "current_request": "Which exchange rate does currency conversion use?",
        "next_action": "Write the replay job",
        "open_questions": ["Replay from the Stripe dashboard or from our own event log?"]},
        {"a21": 2}),
    scenario("hd-07", "continuation", "maya", "payments", "payments", {
        "current_request": "vale, sigue por favor",
        "next_action": "Make the handler ignore events it has already seen"},
        {"a06": 2}),
    scenario("hd-08", "anaphoric", "maya", "payments", "payments", {
        "current_request": "do the one Marco raised",
        "next_action": "Audit what the webhook handler writes at debug level",
        "facts": [{"text": "Marco raised a concern", "entities": ["Marco"]}]},
        {"a13": 2, "a14": 1}),
    scenario("hd-09", "continuation", "tom", "mobile", "mobile", {
        "current_request": "Continue",
        "next_action": "Fix what Apple rejected in the last submission",
        "objective": "Ship 4.2"},
        {"b01": 2, "b02": 2}),
    scenario("hd-10", "continuation", "tom", "mobile", "mobile", {
        "current_request": "jatka",
        "next_action": "Fix the Android 14 crash in the photo picker"},
        {"b05": 2, "b04": 1}),
    scenario("hd-11", "continuation", "tom", "mobile", "mobile", {
        "current_request": "next please",
        "next_action": "Set up the test pass she needs before we ship",
        "facts": [{"text": "Ana blocks releases without it", "entities": ["Ana"]}]},
        {"b06": 2, "b07": 2}),
    scenario("hd-12", "continuation", "tom", "mobile", "mobile", {
        "current_request": "alright, keep going",
        "next_action": "Answer marketing",
        "open_questions": ["Can the in-app banner link to the spring campaign?"]},
        {"b14": 2, "b13": 1}),
    scenario("hd-13", "continuation", "tom", "mobile", "mobile", {
        "current_request": "go ahead",
        "next_action": "Pick the day to ship 4.2",
        "constraints": ["Never release on a Friday"]},
        {"b08": 2, "b09": 2}),
    scenario("hd-14", "self_contained_in_flight", "tom", "mobile", "mobile", {
        "current_request": "Which Gradle version does the Android build use?",
        "next_action": "Fix the Android 14 crash in the photo picker"},
        {"b17": 2}),
    scenario("hd-15", "topic_switch", "tom", "mobile", "mobile", {
        "current_request": "How are crash reports grouped in Sentry?",
        "next_action": "Pick the day to ship 4.2",
        "constraints": ["Never release on a Friday"]},
        {"b19": 2}),
    scenario("hd-16", "anaphoric", "tom", "mobile", "mobile", {
        "current_request": "let's do that one now",
        "next_action": "Regenerate the App Store screenshots for the new iPhone size"},
        {"b11": 2}),
]

# -- test half -----------------------------------------------------------------------------------

DWH = corpus("warehouse", "lena", "warehouse", {
    "c01": "The nightly load of the orders fact table fails when the upstream export is late; "
           "the loader gives up after 3 tries.",
    "c02": "Late upstream exports: the ERP team publishes a ready marker file when the export "
           "is complete.",
    "c03": "The orders dashboard in Looker refreshes every hour.",
    "c04": "Orders fact table is partitioned by order_date; queries without a date filter scan "
           "4 TB.",
    "c05": "Kofi (head of sales ops) needs weekly revenue by region for the board pack.",
    "c06": "Revenue by region is derived from the orders fact joined with dim_store.region.",
    "c07": "The board pack is due on the first Monday of each month.",
    "c08": "Personal data must not leave the EU region; the BigQuery dataset is in "
           "europe-west3.",
    "c09": "Exporting customer emails to the US marketing tool was stopped by legal in March.",
    "c10": "The dbt project runs on Airflow 2.9; the DAG is called dbt_nightly.",
    "c11": "Load testing the dashboard with 200 users showed p95 of 4 s.",
    "c12": "Open question from finance: should refunds be netted out of revenue or shown "
           "separately?",
    "c13": "Refunds live in fct_refunds and are linked to orders by order_id.",
    "c14": "The warehouse cost alert fires above 900 EUR a day.",
    "c15": "Nightly fails are posted to the #data-alerts channel.",
    "c16": "The staging copy of the warehouse is rebuilt every Sunday.",
    "c17": "Order numbers from the old shop start with W-; the new shop uses numeric ids.",
    "c18": "The loader retry count is set in loader.yaml (max_attempts).",
    "c19": "Birthday cake for Sam on Wednesday.",
    "c20": "The fact table for web sessions is loaded from the tracking bucket at 02:00.",
    "c21": "Regional managers asked for a new filter by store size in the sales dashboard.",
})

OPS = corpus("office", "raj", "office", {
    "d01": "The lease for the Leeds office ends on 30 June; the landlord wants notice 90 days "
           "before.",
    "d02": "Notice to the landlord must be sent by registered post to the address in clause "
           "14.",
    "d03": "The new office in Manchester has 60 desks and opens in July.",
    "d04": "Moving company quotes: Hartley 8,200 GBP, MoveCo 7,400 GBP; both include packing.",
    "d05": "Wen from procurement requires three quotes for any purchase above 5,000 GBP.",
    "d06": "Procurement approvals take about a week once the quotes are uploaded to Coupa.",
    "d07": "Desks in Manchester are booked through the Deskbird app.",
    "d08": "Network: the Manchester circuit is installed by BT on 12 June.",
    "d09": "Open question: does the move include the server rack or do we retire it?",
    "d10": "The server rack in Leeds hosts only the old file server, retired since January.",
    "d11": "The office move newsletter goes out every Friday.",
    "d12": "Hazardous waste (old batteries, toner) needs a licensed carrier.",
    "d13": "No moves during the quarter-end close week; finance needs everyone at their desk.",
    "d14": "The quarter ends on 30 June; close week is the last week of June.",
    "d15": "The Leeds kitchen fridge will be donated to the food bank.",
    "d16": "Parking permits for Manchester are handled by the building manager.",
    "d17": "The move of the Leeds printers was done last year.",
    "d18": "Insurance for the move is covered by the company policy up to 50,000 GBP.",
    "d19": "Quotes for new chairs came in at 240 GBP each.",
    "d20": "The landlord of the Manchester building is Northside Estates.",
})

TEST = [DWH, OPS,
    scenario("ht-01", "continuation", "lena", "warehouse", "warehouse", {
        "current_request": "weiter bitte",
        "next_action": "Stop the nightly orders load from failing when the export is late",
        "objective": "Reliable nightly loads"},
        {"c01": 2, "c02": 2, "c18": 1}),
    scenario("ht-02", "continuation", "lena", "warehouse", "warehouse", {
        "current_request": "ok, continue",
        "next_action": "Build the numbers he needs for the board",
        "facts": [{"text": "Kofi asked for them", "entities": ["Kofi"]}]},
        {"c05": 2, "c06": 2, "c07": 1}),
    scenario("ht-03", "continuation", "lena", "warehouse", "warehouse", {
        "current_request": "suivant",
        "next_action": "Finish the revenue model",
        "open_questions": ["Net refunds out of revenue or show them separately?"]},
        {"c12": 2, "c13": 2}),
    scenario("ht-04", "continuation", "lena", "warehouse", "warehouse", {
        "current_request": "yes, go on",
        "next_action": "Send the customer list to the marketing tool",
        "constraints": ["Personal data stays in the EU"]},
        {"c08": 2, "c09": 2}),
    scenario("ht-05", "self_contained_in_flight", "lena", "warehouse", "warehouse", {
        "current_request": "Which Airflow version runs the dbt project?",
        "next_action": "Stop the nightly orders load from failing when the export is late"},
        {"c10": 2}),
    scenario("ht-06", "topic_switch", "lena", "warehouse", "warehouse", {
        "current_request": "What is the threshold of the warehouse cost alert?",
        "next_action": "Build the numbers he needs for the board",
        "facts": [{"text": "Kofi asked for them", "entities": ["Kofi"]}]},
        {"c14": 2}),
    scenario("ht-07", "continuation", "lena", "warehouse", "warehouse", {
        "current_request": "avanti",
        "next_action": "Speed up the queries on the orders fact table"},
        {"c04": 2}),
    scenario("ht-08", "anaphoric", "lena", "warehouse", "warehouse", {
        "current_request": "do the thing finance raised",
        "next_action": "Decide how refunds appear in revenue",
        "facts": [{"text": "finance raised a question", "entities": ["finance"]}]},
        {"c12": 2, "c13": 1}),
    scenario("ht-09", "continuation", "raj", "office", "office", {
        "current_request": "Continue",
        "next_action": "Tell the Leeds landlord we are leaving",
        "objective": "Move from Leeds to Manchester"},
        {"d01": 2, "d02": 2}),
    scenario("ht-10", "continuation", "raj", "office", "office", {
        "current_request": "dale",
        "next_action": "Book the movers",
        "facts": [{"text": "Wen must approve it", "entities": ["Wen"]}]},
        {"d04": 2, "d05": 2, "d06": 1}),
    scenario("ht-11", "continuation", "raj", "office", "office", {
        "current_request": "ok next",
        "next_action": "Plan what happens to the IT equipment",
        "open_questions": ["Does the server rack move or do we retire it?"]},
        {"d09": 1, "d10": 2}),
    scenario("ht-12", "continuation", "raj", "office", "office", {
        "current_request": "proceed please",
        "next_action": "Pick the moving week",
        "constraints": ["No moves during the close week"]},
        {"d13": 2, "d14": 2}),
    scenario("ht-13", "self_contained_in_flight", "raj", "office", "office", {
        "current_request": "When does BT install the Manchester circuit?",
        "next_action": "Book the movers"},
        {"d08": 2}),
    scenario("ht-14", "topic_switch", "raj", "office", "office", {
        "current_request": "Who handles the parking permits in Manchester?",
        "next_action": "Pick the moving week",
        "constraints": ["No moves during the close week"]},
        {"d16": 2}),
    scenario("ht-15", "continuation", "raj", "office", "office", {
        "current_request": "weiter",
        "next_action": "Get rid of the old batteries and toner"},
        {"d12": 2}),
    scenario("ht-16", "anaphoric", "raj", "office", "office", {
        "current_request": "that one, please",
        "next_action": "Check the insurance cover for the move"},
        {"d18": 2}),
]


def write(path: Path, lines: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines),
                    encoding="utf-8")


def main() -> None:
    write(HERE / "handwritten_dev.jsonl", DEV)
    write(HERE / "handwritten_test.jsonl", TEST)


if __name__ == "__main__":
    main()
