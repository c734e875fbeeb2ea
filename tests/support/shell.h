/*
 * shell.h — the tests' own set-up commands through the shell, shared by
 * the integration harness (harness.h) and the cluster tests.
 */
#ifndef SBX_TEST_SHELL_H
#define SBX_TEST_SHELL_H

/* test_shf — run the shell command line made from fmt (printf(3), at most
 * 2047 bytes) with system(3); its exit status, or -1 when it did not exit
 * (a signal).  For the test's own set-up commands (ip, nft, servers in a
 * netns), never for input from a sandbox. */
int test_shf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
