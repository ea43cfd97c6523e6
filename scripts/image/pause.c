// pause: the process that holds a pod sandbox's namespaces open while its containers come and
// go. It is PID 1 of the sandbox when the pod shares its PID namespace, so it also reaps the
// orphans re-parented to it. Sleeps until SIGTERM or SIGINT, then exits 0.
// Built static (gcc -static) so the image needs nothing but this file.
#include <signal.h>    // sigaction, sigsuspend
#include <stdio.h>     // fprintf
#include <string.h>    // strcmp
#include <sys/wait.h>  // waitpid
#include <unistd.h>    // _exit

static void on_stop(int sig) {
  (void)sig;
  _exit(0);
}

static void on_child(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char** argv) {
  if (argc > 1 && (strcmp(argv[1], "-v") == 0 || strcmp(argv[1], "--version") == 0)) {
    fprintf(stdout, "moerl pause 1\n");
    return 0;
  }
  struct sigaction stop = {.sa_handler = on_stop};
  struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
  sigemptyset(&stop.sa_mask);
  sigemptyset(&child.sa_mask);
  if (sigaction(SIGTERM, &stop, NULL) != 0 || sigaction(SIGINT, &stop, NULL) != 0 ||
      sigaction(SIGCHLD, &child, NULL) != 0) {
    perror("pause: sigaction");
    return 1;
  }
  sigset_t none;
  sigemptyset(&none);
  for (;;) sigsuspend(&none);
}
