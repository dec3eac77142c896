// Package hoststat reads what the host and its processes are doing from
// Linux's procfs: the machine's CPU time (/proc/stat), a process's CPU time
// (/proc/PID/stat) and resident memory (/proc/PID/status), and the load
// average (/proc/loadavg). The parsers take the file's text, so they are
// tested on fixed inputs; the readers around them return "not known" rather
// than an error where a benchmark would rather go on without the number.
//
// Watch and LoadSampler sample these in the background while a benchmark
// runs, for the reports of `tandem bench experiment` and `tandem bench
// soak`.
package hoststat
